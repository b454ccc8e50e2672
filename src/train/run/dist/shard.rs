//! ZeRO-1 and -2: AdamW's state split over the data-parallel ranks. Every
//! group of gradients the ranks sum together (a bucket, the embedding's
//! table) is cut into one block per rank, the last padded with zeros
//! ([`super::buckets::block_len`]); rank r keeps the values and moments of
//! block r of every group — pieces of parameters, a parameter split where
//! a block ends — updates them from block r of the summed gradients, and
//! the ranks all-gather the updated blocks into every rank's parameters.

use super::{sum_scalars, Collective, GradientLayout};
use crate::config::TrainConfig;
use crate::train::network::grads::Grads;
use crate::train::network::ops::grad_norm::{self, Clipping};
use crate::train::network::optim::AdamW;
use crate::train::network::params::Params;
use anyhow::{Context, Result};
use candle_core::{Tensor, Var};
use std::ops::Range;

/// The part of one parameter in this rank's block of its group.
struct Piece {
    group: usize,
    param: String,
    /// Its elements within the parameter (flattened).
    range: Range<usize>,
    /// Where they start in the block.
    at: usize,
}

/// This rank's share of the optimizer: its pieces, their values (f32 for
/// f32 parameters: the master weights) and AdamW over them.
pub struct Sharded {
    /// Each group's parameters and element counts, in order.
    groups: Vec<Vec<(String, usize)>>,
    pieces: Vec<Piece>,
    /// AdamW over the pieces, one variable each, named `param[a..b]`
    /// (the names checkpoints write the moments under).
    pub opt: AdamW,
}

impl Sharded {
    /// Rank `rank` of `world`'s share of `params`, grouped as `layout` sums
    /// their gradients.
    pub fn new(
        layout: &GradientLayout,
        params: &Params,
        cfg: &TrainConfig,
        (rank, world): (usize, usize),
    ) -> Result<Sharded> {
        let (mut groups, mut pieces, mut vars) = (Vec::new(), Vec::new(), Vec::new());
        for (g, names) in layout.groups().into_iter().enumerate() {
            let sizes = names
                .iter()
                .map(|n| Ok((n.clone(), params.get(n)?.elem_count())))
                .collect::<Result<Vec<_>>>()?;
            let len: usize = sizes.iter().map(|(_, n)| n).sum();
            let block = super::buckets::block_len(len, world);
            let mine = (rank * block).min(len)..((rank + 1) * block).min(len);
            let mut offset = 0;
            for (name, n) in &sizes {
                let (a, b) = (offset.max(mine.start), (offset + n).min(mine.end));
                if a < b {
                    let p = params.get(name)?;
                    let values = p.flatten_all()?.narrow(0, a - offset, b - a)?;
                    vars.push((
                        format!("{name}[{}..{}]", a - offset, b - offset),
                        Var::from_tensor(&values)?,
                        p.rank() >= 2,
                    ));
                    pieces.push(Piece {
                        group: g,
                        param: name.clone(),
                        range: a - offset..b - offset,
                        at: a - mine.start,
                    });
                }
                offset += n;
            }
            groups.push(sizes);
        }
        let opt = AdamW::over(vars.into_iter(), cfg)?;
        Ok(Sharded {
            groups,
            pieces,
            opt,
        })
    }

    /// The pieces' values from the parameters again (after a resume set them).
    pub fn refresh(&mut self, params: &Params) -> Result<()> {
        for (piece, (_, var)) in self.pieces.iter().zip(self.opt.vars()) {
            let p = params.get(&piece.param)?.flatten_all()?;
            var.set(&p.narrow(0, piece.range.start, piece.range.len())?)?;
        }
        Ok(())
    }

    /// One update from this rank's blocks of the summed gradients in
    /// `layout`: the global norm from every rank's blocks, AdamW on the
    /// pieces, the updated blocks all-gathered into `params`. Returns the
    /// norm (not finite: nothing changed) and the seconds spent in the
    /// norm's sum and the all-gather.
    pub fn step(
        &mut self,
        layout: &GradientLayout,
        params: &Params,
        (lr, max_norm): (f64, f64),
        comm: &dyn Collective,
    ) -> Result<(f64, f64)> {
        let sums = &layout.shards().context("a sharded layout")?.sums;
        let mut blocks = Vec::with_capacity(self.pieces.len());
        for (p, (name, _)) in self.pieces.iter().zip(self.opt.vars()) {
            let block = sums[p.group].narrow(0, p.at, p.range.len())?;
            blocks.push((name.to_string(), block));
        }
        let grads = Grads::of(blocks.into_iter());
        let blocks: Vec<&Tensor> = grads.iter().map(|(_, g)| g).collect();
        let device = sums.first().context("a group of gradients")?.device();
        let mine = squares(&blocks)?;
        let summing = std::time::Instant::now();
        let [squares] = sum_scalars(comm, [mine], device)?;
        let mut comm_s = summing.elapsed().as_secs_f64();
        let clipping = Clipping::from_norm(squares.sqrt(), max_norm);
        let norm = self.opt.step(&grads, lr, &clipping)?;
        if norm.is_finite() {
            let gathering = std::time::Instant::now();
            self.gather(params, comm)?;
            comm_s += gathering.elapsed().as_secs_f64();
        }
        Ok((norm, comm_s))
    }

    /// Every rank's updated blocks into every rank's parameters, a group at
    /// a time (the whole group exists only while it is copied in).
    fn gather(&self, params: &Params, comm: &dyn Collective) -> Result<()> {
        let world = comm.ranks().world_size;
        let vars: Vec<_> = self.opt.vars().map(|(_, v)| v).collect();
        for (g, sizes) in self.groups.iter().enumerate() {
            let first = params.get(&sizes[0].0)?;
            let len: usize = sizes.iter().map(|(_, n)| n).sum();
            let block = super::buckets::block_len(len, world);
            let send = Tensor::zeros(block, first.dtype(), first.device())?;
            for (piece, var) in self.pieces.iter().zip(&vars).filter(|(p, _)| p.group == g) {
                send.slice_set(var.as_tensor(), 0, piece.at)?;
            }
            let whole = Tensor::zeros(block * world, first.dtype(), first.device())?;
            comm.all_gather_into(&send, &whole)?;
            let mut offset = 0;
            for (name, n) in sizes {
                let var = params.var(name)?;
                var.set(&whole.narrow(0, offset, *n)?.reshape(var.shape())?)?;
                offset += n;
            }
        }
        Ok(())
    }

    /// The bytes of this rank's pieces' values and of their moments.
    pub fn bytes(&self) -> (usize, usize) {
        let values = self
            .opt
            .vars()
            .map(|(_, v)| v.elem_count() * v.dtype().size_in_bytes())
            .sum();
        (values, self.opt.moment_bytes())
    }
}

/// The sum of the squares of `blocks`: in f64 on the host (a block is one
/// long run of values, which a sum in f32 rounds far more than the
/// replicated norm's, row by row), by the norm's own kernel on a GPU.
fn squares(blocks: &[&Tensor]) -> Result<f64> {
    if blocks.iter().all(|b| b.device().is_cpu()) {
        let mut sum = 0.0;
        for b in blocks {
            sum += b
                .to_dtype(candle_core::DType::F64)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f64>()?;
        }
        return Ok(sum);
    }
    Ok(grad_norm::clipping(blocks, 0.0)?.norm()?.powi(2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::run::dist::buckets::tests::tiny_model;

    /// Over any world size, every value of every parameter lies in exactly
    /// one rank's block, whole parameters split where blocks end, groups
    /// padded where the world size does not divide them.
    #[test]
    fn every_value_is_in_exactly_one_ranks_block() -> Result<()> {
        let (model, grads, params) = tiny_model();
        let layout = GradientLayout::new(&grads, &model.stages())?;
        let cfg = TrainConfig::default();
        let (mut split, mut uneven) = (false, false);
        for world in [1, 2, 3, 4] {
            let mut seen: std::collections::BTreeMap<String, Vec<u8>> = params
                .iter()
                .map(|(n, v)| (n.clone(), vec![0; v.elem_count()]))
                .collect();
            for rank in 0..world {
                let z = Sharded::new(&layout, &params, &cfg, (rank, world))?;
                for (piece, (name, var)) in z.pieces.iter().zip(z.opt.vars()) {
                    assert_eq!(
                        name,
                        format!(
                            "{}[{}..{}]",
                            piece.param, piece.range.start, piece.range.end
                        )
                    );
                    let whole = params.get(&piece.param)?.flatten_all()?;
                    let want = whole.narrow(0, piece.range.start, piece.range.len())?;
                    assert_eq!(var.to_vec1::<f32>()?, want.to_vec1::<f32>()?);
                    seen.get_mut(&piece.param).unwrap()[piece.range.clone()]
                        .iter_mut()
                        .for_each(|c| *c += 1);
                    split |= piece.range.len() < whole.elem_count();
                }
            }
            for (name, counts) in seen {
                assert!(counts.iter().all(|c| *c == 1), "world {world}: {name}");
            }
            uneven |= layout.groups().iter().any(|g| {
                let len: usize = g.iter().map(|n| params.get(n).unwrap().elem_count()).sum();
                !len.is_multiple_of(world)
            });
        }
        assert!(
            split && uneven,
            "the model exercises split parameters and padded groups"
        );
        Ok(())
    }
}
