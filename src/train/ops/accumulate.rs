//! Gradient buffers that live as long as the trainer, written in place:
//! `buf = 0` and `buf += g` here; a weight's gradient `buf += dyᵀ·x` is the
//! linear layer's ([`super::linear::add_product`]) and an embedding's rows
//! the embedding's ([`super::embedding::add_rows`]). On the CPU in f32 the
//! sums are written into the buffer; elsewhere (other dtypes) the sum is a
//! new tensor that replaces the buffer.
//!
//! Allocating nothing that outlives a pass matters beyond the copies saved:
//! gradients created block by block during the backward pass, between its
//! transients, fragmented the heap (the CPU trainer's resident memory grew
//! ~75 MB a block under recomputation).

use candle_core::{bail, CpuStorage, InplaceOp1, InplaceOp2, Layout, Result, Tensor};
use rayon::prelude::*;

/// buf = 0.
pub fn zero(buf: &mut Tensor) -> Result<()> {
    if super::in_place(buf, &[]) {
        return buf.inplace_op1(&Zero);
    }
    *buf = buf.zeros_like()?;
    Ok(())
}

/// buf += g (same shape).
pub fn add(buf: &mut Tensor, g: &Tensor) -> Result<()> {
    if buf.shape() != g.shape() {
        bail!(
            "adding a {:?} gradient into a {:?} buffer",
            g.shape(),
            buf.shape()
        );
    }
    if super::in_place(buf, &[g]) {
        return buf.inplace_op2(&g.contiguous()?, &Add);
    }
    *buf = (&*buf + g.to_dtype(buf.dtype())?)?;
    Ok(())
}

struct Zero;

impl InplaceOp1 for Zero {
    fn name(&self) -> &'static str {
        "sweep-zero"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        let CpuStorage::F32(v) = s else {
            bail!("expected f32 data")
        };
        // A buffer may be a view into a larger storage (an all-reduced bucket).
        let (start, end) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("expected contiguous data".into()))?;
        v[start..end]
            .par_chunks_mut(1 << 16)
            .for_each(|c| c.fill(0.0));
        Ok(())
    }
}

struct Add;

impl InplaceOp2 for Add {
    fn name(&self) -> &'static str {
        "sweep-add-into"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let g = super::f32s(s2, l2)?;
        let CpuStorage::F32(buf) = s1 else {
            bail!("expected f32 data")
        };
        let buf = &mut buf[l1.start_offset()..l1.start_offset() + g.len()];
        buf.par_chunks_mut(1 << 16)
            .zip(g.par_chunks(1 << 16))
            .for_each(|(b, g)| b.iter_mut().zip(g).for_each(|(b, g)| *b += g));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::ops::testing::{max_diff, rand};

    #[test]
    fn buffers_add_and_zero_in_place() -> Result<()> {
        let mut buf = rand(&[9, 13], 3);
        let alias = buf.clone();
        let g = rand(&[9, 13], 5);
        let want = (&buf + &g)?;
        add(&mut buf, &g)?;
        assert!(max_diff(&buf, &want)? < 1e-7);
        assert!(max_diff(&alias, &want)? < 1e-7, "not in place");
        assert!(add(&mut buf, &rand(&[13, 9], 6)).is_err());
        zero(&mut buf)?;
        assert_eq!(alias.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
        Ok(())
    }
}
