//! The tests' emulated device: CPU tensors whose ops take their GPU paths
//! (the same glue, plans and buffers), each plan run on copies of the
//! storages' bytes by the host emulation of CUDA (`kernels/emulator.rs`);
//! cuBLAS's products and flash attention's forward answered by host
//! references behind the same calls. Outside the tests nothing takes it.

use super::linear::Gemm;
use super::store::{Span, Store};
#[cfg(test)]
use crate::train::network::kernels::emulator::{Buffer, Emulator, Flavor};
use crate::train::network::kernels::{LaunchPlan, Ty};
use candle_core::{bail, CpuStorage, Layout, Result, Storage, Tensor};
#[cfg(test)]
use std::cell::Cell;
use std::cell::RefCell;

#[cfg(test)]
thread_local! {
    static ON: Cell<Option<Flavor>> = const { Cell::new(None) };
}

/// Runs `f` with this thread's ops on the emulated device; None where
/// there is no emulator (its caller says skipped).
#[cfg(test)]
pub fn on<T>(flavor: Flavor, f: impl FnOnce() -> T) -> Option<T> {
    Emulator::get(flavor)?;
    struct Restore(Option<Flavor>);
    impl Drop for Restore {
        fn drop(&mut self) {
            ON.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(ON.with(|c| c.replace(Some(flavor))));
    Some(f())
}

/// Whether this thread's ops are on the emulated device.
pub fn active() -> bool {
    #[cfg(test)]
    let on = ON.with(|c| c.get().is_some());
    #[cfg(not(test))]
    let on = false;
    on
}

/// A CPU storage's contiguous elements, as a plan's operand.
#[cfg_attr(not(test), allow(dead_code))]
pub struct HostOperand<'a> {
    storage: Access<'a>,
    start: usize,
    len: usize,
    ty: Ty,
}

/// How an operand holds its storage: to read, or to write in place.
#[cfg_attr(not(test), allow(dead_code))]
enum Access<'a> {
    Read(&'a CpuStorage),
    Write(RefCell<&'a mut CpuStorage>),
}

impl Span for HostOperand<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn ty(&self) -> Ty {
        self.ty
    }
}

#[cfg(test)]
impl HostOperand<'_> {
    fn buffer(&self) -> Buffer {
        let r = self.start..self.start + self.len;
        let of = |s: &CpuStorage| match s {
            CpuStorage::F32(v) => Buffer::f32(&v[r.clone()]),
            CpuStorage::BF16(v) => Buffer::bf16(&v[r.clone()]),
            CpuStorage::U32(v) => Buffer::u32(&v[r.clone()]),
            _ => unreachable!("operands are made of f32, bf16 or u32 storages"),
        };
        match &self.storage {
            Access::Read(s) => of(s),
            Access::Write(s) => of(&s.borrow()),
        }
    }

    /// Writes a launch's result back into the storage, as the GPU's kernels
    /// write an operand in place; an operand given to read is an error.
    fn write_back(&self, b: &Buffer) -> Result<()> {
        let Access::Write(s) = &self.storage else {
            bail!("a plan wrote an operand it was given to read");
        };
        let r = self.start..self.start + self.len;
        let words = |n: usize| b.bytes.chunks_exact(n);
        match &mut **s.borrow_mut() {
            CpuStorage::F32(v) => v[r].copy_from_slice(&b.to_f32()),
            CpuStorage::BF16(v) => v[r]
                .iter_mut()
                .zip(words(2))
                .for_each(|(x, w)| *x = half::bf16::from_le_bytes([w[0], w[1]])),
            CpuStorage::U32(v) => v[r]
                .iter_mut()
                .zip(words(4))
                .for_each(|(x, w)| *x = u32::from_le_bytes([w[0], w[1], w[2], w[3]])),
            _ => unreachable!("operands are made of f32, bf16 or u32 storages"),
        }
        Ok(())
    }
}

/// An output's bytes as a storage.
#[cfg(test)]
fn storage(b: Buffer) -> CpuStorage {
    match b.ty {
        Ty::F32 => CpuStorage::F32(b.to_f32()),
        Ty::Bf16 => CpuStorage::BF16(
            b.bytes
                .chunks_exact(2)
                .map(|w| half::bf16::from_le_bytes([w[0], w[1]]))
                .collect(),
        ),
        Ty::U32 => CpuStorage::U32(
            b.bytes
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                .collect(),
        ),
    }
}

/// Where a plan stores bf16, each value must be its run in f32 rounded to
/// nearest (the kernels compute in f32 whatever the storage): the plan is
/// run again with every bf16 buffer widened, and each bf16 output and
/// written operand held to it (neighbours within 1e-4 of a tie pass: the
/// reductions add 16 bytes of values at a time, 8 of bf16 and 4 of f32).
#[cfg(test)]
fn rounded_as_in_f32(
    emulator: &Emulator,
    plan: &LaunchPlan,
    before: &[Buffer],
    outputs: &[Buffer],
    after: &[Buffer],
) -> std::result::Result<(), String> {
    if plan.launches.iter().all(|l| l.own != Ty::Bf16) {
        return Ok(());
    }
    let wide = |ty: Ty| if ty == Ty::Bf16 { Ty::F32 } else { ty };
    let mut twin = plan.clone();
    for l in &mut twin.launches {
        l.own = wide(l.own);
    }
    for (ty, _) in twin.outputs.iter_mut().chain(twin.scratch.iter_mut()) {
        *ty = wide(*ty);
    }
    let mut twin_after: Vec<Buffer> = before
        .iter()
        .map(|b| match b.ty {
            Ty::Bf16 => Buffer::f32(&b.to_f32()),
            _ => b.clone(),
        })
        .collect();
    let twin_outputs = emulator.run(&twin, &mut twin_after)?;
    let stored = outputs.iter().zip(&twin_outputs);
    let written = (after.iter().zip(before))
        .zip(&twin_after)
        .filter(|((now, was), _)| now != was)
        .map(|((now, _), twin)| (now, twin));
    for (got, want) in stored.chain(written) {
        if got.ty == Ty::Bf16 {
            super::testing::rounded(got, &want.to_f32(), 1e-4, 0.0)?;
        }
    }
    Ok(())
}

/// The span and type of a storage's contiguous elements under `l`.
fn span(s: &CpuStorage, l: &Layout) -> Result<(usize, usize, Ty)> {
    let Some((start, end)) = l.contiguous_offsets() else {
        bail!("sweep's CUDA kernels take contiguous tensors")
    };
    let ty = match s {
        CpuStorage::F32(_) => Ty::F32,
        CpuStorage::BF16(_) => Ty::Bf16,
        CpuStorage::U32(_) => Ty::U32,
        _ => bail!("sweep's CUDA kernels take f32, bf16 or u32"),
    };
    Ok((start, end - start, ty))
}

impl candle_core::InplaceOp1 for super::store::WithMut<'_, CpuStorage> {
    fn name(&self) -> &'static str {
        "sweep-with-mut"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        (self.0.borrow_mut())(s, l)
    }
}

impl Store for CpuStorage {
    type Device = ();
    type Operand<'a> = HostOperand<'a>;

    fn device(&self) {}

    fn ty(&self) -> Result<Ty> {
        match self {
            CpuStorage::F32(_) => Ok(Ty::F32),
            CpuStorage::BF16(_) => Ok(Ty::Bf16),
            _ => bail!("sweep's CUDA kernels take f32 or bf16"),
        }
    }

    fn operand<'a>(&'a self, l: &Layout) -> Result<HostOperand<'a>> {
        let (start, len, ty) = span(self, l)?;
        let storage = Access::Read(self);
        Ok(HostOperand {
            storage,
            start,
            len,
            ty,
        })
    }

    fn operand_mut<'a>(&'a mut self, l: &Layout) -> Result<HostOperand<'a>> {
        let (start, len, ty) = span(self, l)?;
        let storage = Access::Write(RefCell::new(self));
        Ok(HostOperand {
            storage,
            start,
            len,
            ty,
        })
    }

    fn held<'a>(s: &'a Storage, what: &str) -> Result<&'a CpuStorage> {
        match s {
            Storage::Cpu(s) => Ok(s),
            _ => bail!("{what} is not on the emulated device"),
        }
    }

    fn with_mut<R>(t: &Tensor, f: impl FnOnce(&mut Self, &Layout) -> Result<R>) -> Result<R> {
        super::store::with_mut(t, f)
    }

    #[cfg(not(test))]
    fn execute(_: &(), _: &LaunchPlan, _: &[HostOperand<'_>]) -> Result<Vec<Self>> {
        bail!("sweep's kernels run on the CPU under the tests' emulation of CUDA only")
    }

    #[cfg(test)]
    fn execute(_: &(), plan: &LaunchPlan, operands: &[HostOperand<'_>]) -> Result<Vec<Self>> {
        let flavor = ON.with(|c| c.get()).unwrap_or(Flavor::Plain);
        let Some(emulator) = Emulator::get(flavor) else {
            bail!("no emulator of CUDA on this machine")
        };
        let before: Vec<Buffer> = operands.iter().map(HostOperand::buffer).collect();
        let mut after = before.clone();
        let outputs = emulator
            .run(plan, &mut after)
            .map_err(candle_core::Error::Msg)?;
        rounded_as_in_f32(emulator, plan, &before, &outputs, &after)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", plan.launches[0].entry())))?;
        for ((o, was), now) in operands.iter().zip(&before).zip(&after) {
            if was != now {
                o.write_back(now)?;
            }
        }
        Ok(outputs.into_iter().map(storage).collect())
    }

    fn gemm(
        g: &Gemm,
        c: (&mut CpuStorage, &Layout),
        a: (&CpuStorage, &Layout),
        b: (&CpuStorage, &Layout),
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        let (av, bv) = (values(a.0, a.1)?, values(b.0, b.1)?);
        if a.0.ty()? != b.0.ty()? {
            bail!("{}: the operands differ in dtype", what());
        }
        let mut cv = values(c.0, c.1)?;
        let (reach_a, reach_b, reach_c) = g.reach();
        if reach_a > av.len() || reach_b > bv.len() || reach_c > cv.len() {
            bail!("{}: {g:?} reaches past its operands", what());
        }
        g.on_host(&av, &bv, &mut cv);
        let start = c.1.start_offset();
        match (c.0, a.0.ty()?) {
            (CpuStorage::F32(v), _) => {
                for (o, x) in v[start..].iter_mut().zip(cv) {
                    *o = x as f32;
                }
            }
            (CpuStorage::BF16(v), Ty::Bf16) => {
                for (o, x) in v[start..].iter_mut().zip(cv) {
                    *o = half::bf16::from_f32(x as f32);
                }
            }
            _ => bail!("{}: an f32 or bf16 sum of f32 or bf16 operands", what()),
        }
        Ok(())
    }
}

/// A storage's contiguous values under `l`, in f64.
fn values(s: &CpuStorage, l: &Layout) -> Result<Vec<f64>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        bail!("sweep's cuBLAS products take contiguous tensors")
    };
    Ok(match s {
        CpuStorage::F32(v) => v[a..b].iter().map(|&x| x as f64).collect(),
        CpuStorage::BF16(v) => v[a..b].iter().map(|x| x.to_f64()).collect(),
        _ => bail!("sweep's cuBLAS products take f32 or bf16"),
    })
}
