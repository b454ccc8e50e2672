//! How a step's gradients are summed across ranks: in buckets, in the order the backward
//! finishes them, during it where the engine has a thread ([`super::Background`]), else after;
//! the token embedding's by rows ([`sum_rows`]).

use super::{Background, Collective, Reduce, BUCKET_BYTES};
use crate::train::network::blockwise::Finished;
use crate::train::network::grads::Grads;
use anyhow::{bail, Context, Result};
use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

/// Consecutive tensors in backward order, in buckets of at most [`BUCKET_BYTES`], each ending
/// at a block's end once past [`MIN_BUCKET_BYTES`]. Overlapped and blocking sums share buckets:
/// the same sums, bit for bit.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    /// Each bucket's tensors, as positions in the order given.
    pub groups: Vec<std::ops::Range<usize>>,
}

/// A stage's gradients smaller than this wait for the next stage's (the forecast counts it).
pub use crate::estimate::scaling::MIN_BUCKET_BYTES;

impl Buckets {
    /// `tensors`: each one's backward stage and bytes.
    pub fn plan(tensors: &[(usize, usize)], bucket_bytes: usize) -> Buckets {
        let mut groups = Vec::new();
        let (mut start, mut size) = (0, 0);
        for (i, &(stage, bytes)) in tensors.iter().enumerate() {
            let full = size + bytes > bucket_bytes;
            let stage_done = i > 0 && stage != tensors[i - 1].0 && size >= MIN_BUCKET_BYTES;
            if i > start && (full || stage_done) {
                groups.push(start..i);
                (start, size) = (i, 0);
            }
            size += bytes;
        }
        if start < tensors.len() {
            groups.push(start..tensors.len());
        }
        Buckets { groups }
    }
}

/// A bucket's two f32 host buffers (CPU ranks): gradients are views of one, MPI sums into the
/// other, and they swap every step (PyTorch DDP's bucket views).
struct Pair {
    flats: [Tensor; 2],
    /// The buffer the gradients are views of.
    current: usize,
}

impl Pair {
    fn new(len: usize) -> Result<Pair> {
        let zeros = || Tensor::zeros(len, DType::F32, &Device::Cpu);
        Ok(Pair {
            flats: [zeros()?, zeros()?],
            current: 0,
        })
    }

    /// ZeRO-1's: gradients are views of the padded bucket; `block` receives the reduce-scatter.
    fn scattered(padded: usize, block: &Tensor) -> Result<Pair> {
        Ok(Pair {
            flats: [
                Tensor::zeros(padded, DType::F32, &Device::Cpu)?,
                block.clone(),
            ],
            current: 0,
        })
    }

    /// The buffer holding the bucket's gradients (copied in where not views of it) and the sums'.
    fn send_recv(&self, tensors: &[&Tensor]) -> Result<(Tensor, Tensor)> {
        let send = &self.flats[self.current];
        let mut offset = 0;
        for t in tensors {
            if !is_view(t, send, offset) {
                send.slice_set(&t.flatten_all()?.to_dtype(DType::F32)?, 0, offset)?;
            }
            offset += t.elem_count();
        }
        Ok((send.clone(), self.flats[1 - self.current].clone()))
    }

    /// Once summed: the gradients become views of the sums, and the buffers swap roles.
    fn swap(&mut self, tensors: &mut [&mut Tensor], how: Reduce) -> Result<()> {
        // A scatter's gradients stay views of the bucket they were sent from.
        if how == Reduce::All {
            self.current = 1 - self.current;
        }
        let sums = &self.flats[self.current];
        let mut offset = 0;
        for t in tensors.iter_mut() {
            let n = t.elem_count();
            **t = sums
                .narrow(0, offset, n)?
                .reshape(t.shape())?
                .to_dtype(t.dtype())?;
            offset += n;
        }
        Ok(())
    }
}

/// Whether `t` is the f32 data of `flat` from `offset` on.
fn is_view(t: &Tensor, flat: &Tensor, offset: usize) -> bool {
    let start = |x: &Tensor| {
        let (storage, layout) = x.storage_and_layout();
        match (&*storage, layout.contiguous_offsets()) {
            (Storage::Cpu(CpuStorage::F32(v)), Some((a, _))) => Some((v.as_ptr(), a)),
            _ => None,
        }
    };
    match (start(t), start(flat)) {
        (Some((p, a)), Some((q, b))) => p == q && a == b + offset,
        _ => false,
    }
}

/// Sums `tensors` over all ranks in place, in buckets of at most `bucket_bytes`.
pub fn all_reduce_in_buckets(
    comm: &dyn Collective,
    tensors: &mut [&mut Tensor],
    bucket_bytes: usize,
) -> Result<()> {
    if comm.is_single() {
        return Ok(());
    }
    let sizes: Vec<(usize, usize)> = tensors.iter().map(|t| (0, size_of_tensor(t))).collect();
    for group in Buckets::plan(&sizes, bucket_bytes).groups {
        sum_bucket(comm, &mut tensors[group])?;
    }
    Ok(())
}

/// Sums one bucket's tensors over all ranks in place, as one all-reduce.
fn sum_bucket(comm: &dyn Collective, bucket: &mut [&mut Tensor]) -> Result<()> {
    let flat = bucket
        .iter()
        .map(|t| t.flatten_all())
        .collect::<candle_core::Result<Vec<_>>>()?;
    let flat = if flat.len() == 1 {
        flat.into_iter().next().expect("one tensor")
    } else {
        Tensor::cat(&flat, 0)?
    };
    let summed = comm.all_reduce_sum(&flat)?;
    let mut offset = 0;
    for t in bucket.iter_mut() {
        let n = t.elem_count();
        **t = summed.narrow(0, offset, n)?.reshape(t.shape())?;
        offset += n;
    }
    Ok(())
}

fn size_of_tensor(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

/// The gradients in backward order and their buckets, planned once, the same on every rank;
/// the token embedding's travels as its used rows ([`sum_rows`]).
pub struct GradientLayout {
    names: Vec<String>,
    /// When each tensor is finished.
    finished: Vec<Finished>,
    /// Over `names` but the last when `by_rows`.
    buckets: Buckets,
    /// The last of `names` is the token embedding, summed by rows.
    by_rows: bool,
    /// Each bucket's buffers once it has been summed on the host.
    pairs: Vec<Option<Pair>>,
    /// ZeRO: each rank keeps its block of every sum.
    shards: Option<Shards>,
}

/// ZeRO's side: every group reduce-scattered (padded to a multiple of the world size).
pub struct Shards {
    /// 1: gradient buffers kept between steps; 2: each dropped once its sum is scattered.
    pub stage: u8,
    /// This rank's block of each group's sum, [`block_len`] long (zero past the group's end).
    pub sums: Vec<Tensor>,
}

/// A rank's block of a group of `len` values over `world` ranks.
pub fn block_len(len: usize, world: usize) -> usize {
    len.div_ceil(world.max(1))
}

impl GradientLayout {
    /// The layout of `grads` over the model's stages (`Llama::stages`).
    pub fn new(grads: &Grads, stages: &[(Finished, Vec<&Tensor>)]) -> Result<GradientLayout> {
        let (mut names, mut finished, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
        for (stage, (f, weights)) in stages.iter().enumerate() {
            for w in weights {
                let name = grads
                    .name_of(w)
                    .context("a weight of the model without a gradient buffer")?;
                let g = grads.get(name).context("a gradient buffer per name")?;
                names.push(name.to_string());
                finished.push(*f);
                sizes.push((stage, size_of_tensor(g)));
            }
        }
        if names.len() != grads.iter().count() {
            bail!(
                "{} gradients, of which the model's stages name {}",
                grads.iter().count(),
                names.len()
            );
        }
        // The embedding's table is the whole last stage.
        let by_rows = matches!(stages.last(), Some((Finished::Embeddings, w)) if w.len() == 1 && w[0].rank() == 2);
        let bucketed = &sizes[..sizes.len() - by_rows as usize];
        let buckets = Buckets::plan(bucketed, BUCKET_BYTES);
        Ok(GradientLayout {
            finished,
            names,
            pairs: buckets.groups.iter().map(|_| None).collect(),
            buckets,
            by_rows,
            shards: None,
        })
    }

    /// The groups of gradients summed together, by name: the buckets, then the embedding's table.
    pub fn groups(&self) -> Vec<&[String]> {
        let mut groups: Vec<&[String]> = self
            .buckets
            .groups
            .iter()
            .map(|g| &self.names[g.clone()])
            .collect();
        if self.by_rows {
            groups.push(&self.names[self.names.len() - 1..]);
        }
        groups
    }

    /// Sums by ZeRO `stage` (1 or 2) from now on, into [`GradientLayout::shards`].
    pub fn shard(&mut self, stage: u8, world: usize, grads: &Grads) -> Result<()> {
        let mut sums = Vec::new();
        for group in self.groups() {
            let first = grads.get(&group[0]).context("a gradient per name")?;
            let len: usize = group
                .iter()
                .map(|n| grads.get(n).map_or(0, |g| g.elem_count()))
                .sum();
            let dtype = if first.device().is_cpu() {
                DType::F32
            } else {
                first.dtype()
            };
            sums.push(Tensor::zeros(block_len(len, world), dtype, first.device())?);
        }
        self.shards = Some(Shards { stage, sums });
        self.pairs.iter_mut().for_each(|p| *p = None);
        Ok(())
    }

    pub fn shards(&self) -> Option<&Shards> {
        self.shards.as_ref()
    }

    /// The bytes the sums keep beside the gradients: second buffers, or this rank's blocks.
    pub fn sum_bytes(&self) -> usize {
        match &self.shards {
            Some(sh) => sh.sums.iter().map(size_of_tensor).sum(),
            None => self
                .pairs
                .iter()
                .flatten()
                .map(|p| size_of_tensor(&p.flats[0]))
                .sum(),
        }
    }

    fn reduce(&self) -> Reduce {
        match self.shards {
            Some(_) => Reduce::Scatter,
            None => Reduce::All,
        }
    }

    /// Starts bucket `i`'s sum on `bg`, or sums it now where there is none.
    fn send_bucket(
        &mut self,
        i: usize,
        grads: &mut Grads,
        comm: &dyn Collective,
        bg: Option<&mut Box<dyn Background>>,
    ) -> Result<()> {
        let group = self.buckets.groups[i].clone();
        let names = self.names[group].to_vec();
        let names = names.as_slice();
        let tensors = names
            .iter()
            .map(|n| grads.get(n).context("a gradient the layout names"))
            .collect::<Result<Vec<_>>>()?;
        let on_host = tensors.iter().all(|t| t.device().is_cpu());
        let how = self.reduce();
        let stage = self.shards.as_ref().map_or(0, |s| s.stage);
        if !on_host {
            // A GPU's buckets: concatenated, summed, written back (all-reduce) or kept (scatter).
            let mut tensors = grads.ordered_mut(names)?;
            match &self.shards {
                None => sum_bucket(comm, &mut tensors)?,
                Some(sh) => {
                    let refs: Vec<&Tensor> = tensors.iter().map(|t| &**t).collect();
                    let padded = sh.sums[i].elem_count() * comm.ranks().world_size;
                    comm.reduce_scatter_into(
                        &packed(&refs, padded, refs[0].dtype())?,
                        &sh.sums[i],
                    )?;
                }
            }
        } else {
            let (send, recv) = if stage == 2 {
                let sums = &self.shards.as_ref().expect("stage 2 shards").sums[i];
                let padded = sums.elem_count() * comm.ranks().world_size;
                (packed(&tensors, padded, DType::F32)?, sums.clone())
            } else {
                self.buffers(i, &tensors, comm.ranks().world_size)?
            };
            match bg {
                Some(bg) => bg.start(send, recv, how)?,
                None if how == Reduce::All => comm.all_reduce_into(&send, &recv)?,
                None => comm.reduce_scatter_into(&send, &recv)?,
            }
        }
        if stage == 2 {
            names.iter().for_each(|n| grads.release(n));
        }
        Ok(())
    }

    /// Bucket `i`'s send and receive buffers, its gradients in the first.
    fn buffers(&mut self, i: usize, tensors: &[&Tensor], world: usize) -> Result<(Tensor, Tensor)> {
        if self.pairs[i].is_none() {
            let len = tensors.iter().map(|t| t.elem_count()).sum();
            self.pairs[i] = Some(match &self.shards {
                None => Pair::new(len)?,
                Some(sh) => Pair::scattered(block_len(len, world) * world, &sh.sums[i])?,
            });
        }
        self.pairs[i]
            .as_ref()
            .expect("made above")
            .send_recv(tensors)
    }

    /// A step's sum: in the background where `comm` has one.
    pub fn begin<'a>(&'a mut self, comm: &dyn Collective) -> GradientSum<'a> {
        let ready = vec![false; self.names.len()];
        GradientSum {
            background: if comm.is_single() {
                None
            } else {
                comm.background()
            },
            ready,
            layout: self,
            started: 0,
            tokens: Vec::new(),
        }
    }
}

/// `tensors` one after another in a zero buffer of `padded` values.
fn packed(tensors: &[&Tensor], padded: usize, dtype: DType) -> Result<Tensor> {
    let device = tensors.first().map_or(Device::Cpu, |t| t.device().clone());
    let flat = Tensor::zeros(padded, dtype, &device)?;
    let mut offset = 0;
    for t in tensors {
        flat.slice_set(&t.flatten_all()?.to_dtype(dtype)?, 0, offset)?;
        offset += t.elem_count();
    }
    Ok(flat)
}

/// One step's sum of the gradients across ranks.
pub struct GradientSum<'a> {
    layout: &'a mut GradientLayout,
    background: Option<Box<dyn Background>>,
    ready: Vec<bool>,
    /// Buckets handed to the background so far.
    started: usize,
    /// The token embedding's rows the step's inputs use: the only ones with non-zero gradients.
    tokens: Vec<bool>,
}

impl GradientSum<'_> {
    /// A micro-batch's input ids (each micro-batch of the step's).
    pub fn tokens(&mut self, ids: &[u32]) {
        for &id in ids {
            let id = id as usize;
            if id >= self.tokens.len() {
                self.tokens.resize(id + 1, false);
            }
            self.tokens[id] = true;
        }
    }

    /// The last micro-batch's backward finished these gradients: start every complete bucket.
    pub fn finished(
        &mut self,
        f: Finished,
        grads: &mut Grads,
        comm: &dyn Collective,
    ) -> Result<()> {
        let Some(bg) = self.background.as_mut() else {
            return Ok(());
        };
        let l = &mut *self.layout;
        for (ready, when) in self.ready.iter_mut().zip(&l.finished) {
            *ready |= *when == f;
        }
        while let Some(group) = l.buckets.groups.get(self.started).cloned() {
            if !self.ready[group].iter().all(|r| *r) {
                break;
            }
            l.send_bucket(self.started, grads, comm, Some(bg))?;
            self.started += 1;
        }
        Ok(())
    }

    /// Every gradient summed in place (under ZeRO, this rank's blocks).
    pub fn finish(mut self, comm: &dyn Collective, grads: &mut Grads) -> Result<()> {
        if comm.is_single() && self.layout.shards.is_none() {
            return Ok(());
        }
        let l = &mut *self.layout;
        let mut bg = self.background.take();
        // Buckets not started by a hook (all of them without a background).
        for i in self.started..l.buckets.groups.len() {
            l.send_bucket(i, grads, comm, bg.as_mut())?;
        }
        if let Some(bg) = bg {
            bg.finish()?;
        }
        let how = l.reduce();
        for (group, pair) in l.buckets.groups.iter().zip(&mut l.pairs) {
            if let Some(pair) = pair {
                pair.swap(&mut grads.ordered_mut(&l.names[group.clone()])?, how)?;
            }
        }
        if l.by_rows {
            let name = l.names.last().expect("the embedding is last");
            let mut table = grads.ordered_mut(std::slice::from_ref(name))?;
            sum_rows(comm, table[0], &self.tokens)?;
            if let Some(sh) = &l.shards {
                // This rank's block of the (whole, summed) table.
                let sums = sh.sums.last().expect("the table's block");
                let (n, len) = (sums.elem_count(), table[0].elem_count());
                let start = (comm.ranks().rank * n).min(len);
                let mine = table[0]
                    .flatten_all()?
                    .narrow(0, start, (len - start).min(n))?;
                sums.zero_set()?;
                sums.slice_set(&mine.to_dtype(sums.dtype())?, 0, 0)?;
                if sh.stage == 2 {
                    grads.release(name);
                }
            }
        }
        Ok(())
    }
}

/// Sums a table's gradient where only rows some rank marked in `used` can be non-zero: the
/// union of rows first, then those rows alone — the full sum's bits for a fraction of the bytes.
pub fn sum_rows(comm: &dyn Collective, table: &mut Tensor, used: &[bool]) -> Result<()> {
    let (rows, dim) = table.dims2()?;
    let device = table.device();
    let mut marks = vec![0f32; rows];
    for (m, u) in marks.iter_mut().zip(used) {
        *m = *u as u8 as f32;
    }
    let marks = comm.all_reduce_sum(&Tensor::from_vec(marks, rows, device)?)?;
    let union: Vec<u32> = marks
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?
        .iter()
        .enumerate()
        .filter(|(_, m)| **m > 0.0)
        .map(|(i, _)| i as u32)
        .collect();
    if union.is_empty() {
        return Ok(());
    }
    let n = union.len();
    let index = Tensor::from_vec(union, n, device)?;
    let mine = table.index_select(&index, 0)?;
    let sum = comm
        .all_reduce_sum(&mine.flatten_all()?)?
        .reshape((n, dim))?
        .to_dtype(table.dtype())?;
    let index = index.unsqueeze(1)?.broadcast_as((n, dim))?.contiguous()?;
    table.scatter_set(&index, &sum, 0)?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::{AttentionKind, ModelOverrides, Recompute};
    use crate::train::network::model::{Llama, ModelSpec};

    #[test]
    fn buckets_are_consecutive_and_a_large_tensor_travels_alone() {
        let plan = |bytes: &[usize]| {
            let one_stage: Vec<_> = bytes.iter().map(|b| (0, *b)).collect();
            Buckets::plan(&one_stage, 10).groups
        };
        assert_eq!(
            plan(&[4, 4, 4, 20, 1, 9, 1]),
            [0..2, 2..3, 3..4, 4..6, 6..7]
        );
        assert_eq!(plan(&[]), Vec::<std::ops::Range<usize>>::new());
        // A stage's end closes a bucket that holds the minimum, not a smaller one.
        let m = MIN_BUCKET_BYTES;
        let staged = [(0, m), (1, 10), (1, 10), (2, 10), (3, m), (3, 3 * m)];
        assert_eq!(Buckets::plan(&staged, 4 * m).groups, [0..1, 1..5, 5..6]);
    }

    /// A two-layer model and its zero gradient buffers.
    pub(crate) fn tiny_model() -> (Llama, Grads, crate::train::network::params::Params) {
        let o = ModelOverrides {
            dim: Some(16),
            n_layers: Some(2),
            n_heads: Some(2),
            vocab_size: Some(40),
            multiple_of: Some(16),
            ..Default::default()
        };
        let cfg = crate::config::ModelConfig::resolve("tiny", &o).unwrap();
        let spec = ModelSpec {
            cfg,
            attention: AttentionKind::Eager,
            max_seq: 8,
            device: candle_core::Device::Cpu,
            dtype: DType::F32,
            bf16_matmuls: false,
            recompute: Recompute::None,
        };
        let params = spec.init_params(1).unwrap();
        let model = Llama::new(&params, &spec).unwrap();
        let grads = Grads::buffers_for(&params).unwrap();
        (model, grads, params)
    }

    #[test]
    fn gradients_go_in_the_order_the_backward_pass_finishes_them() {
        let (model, grads, _) = tiny_model();
        let layout = GradientLayout::new(&grads, &model.stages()).unwrap();
        let first = |prefix: &str| {
            layout
                .names
                .iter()
                .position(|n| n.starts_with(prefix))
                .unwrap()
        };
        assert!(first("norm.") < first("layers.1.") && first("output.") < first("layers.1."));
        assert!(first("layers.1.") < first("layers.0."));
        assert_eq!(layout.names.last().unwrap(), "tok_embeddings.weight");
        assert_eq!(layout.names.len(), grads.iter().count());
        assert_eq!(layout.finished.first(), Some(&Finished::Head));
        assert_eq!(layout.finished[first("layers.0.")], Finished::Block(0));
        // A model that does not name every gradient is refused.
        let stages = model.stages();
        let err = GradientLayout::new(&grads, &stages[..stages.len() - 1])
            .err()
            .unwrap();
        assert!(err.to_string().contains("name"), "{err}");
    }

    /// Step after step the sums land in the gradients (the stand-in engine
    /// sums to four times each rank's values), which stay views of their
    /// bucket's buffer; the embedding's sum is the full table's, though only
    /// the rows of the step's tokens travel.
    #[test]
    fn sums_land_in_the_gradients_and_the_embedding_travels_by_rows() -> Result<()> {
        let (model, mut grads, _) = tiny_model();
        let mut layout = GradientLayout::new(&grads, &model.stages())?;
        assert!(layout.by_rows);
        let comm = crate::train::run::dist::tests::Peer::doubled();
        let used = [3u32, 7, 3];
        for step in 0..3 {
            grads.zero()?;
            let mut want = Vec::new();
            for (i, t) in grads.tensors_mut().into_iter().enumerate() {
                let (n, shape) = (t.elem_count(), t.shape().clone());
                let mut v: Vec<f32> = (0..n).map(|j| (i * 31 + j + step) as f32 * 0.25).collect();
                if let [rows, dim] = shape.dims() {
                    if *rows == 40 {
                        // The embedding: non-zero only in the rows of `used`.
                        for (r, row) in v.chunks_mut(*dim).enumerate() {
                            if !used.contains(&(r as u32)) {
                                row.fill(0.0);
                            }
                        }
                    }
                }
                let g = Tensor::from_vec(v.clone(), shape, &Device::Cpu)?;
                crate::train::network::ops::accumulate::add(t, &g)?;
                want.push(v.iter().map(|x| x * 4.0).collect::<Vec<f32>>());
            }
            let mut sum = layout.begin(&comm);
            sum.tokens(&used);
            sum.finish(&comm, &mut grads)?;
            for ((name, t), want) in grads.iter().zip(&want) {
                let got = t.flatten_all()?.to_vec1::<f32>()?;
                assert!(got == *want, "step {step}, {name}");
            }
        }
        // Every bucketed gradient is a view of its bucket's current buffer.
        let tensors = grads.ordered_mut(&layout.names)?;
        for (group, pair) in layout.buckets.groups.iter().zip(&layout.pairs) {
            let pair = pair.as_ref().expect("summed on the host");
            let mut offset = 0;
            for t in &tensors[group.clone()] {
                assert!(is_view(t, &pair.flats[pair.current], offset));
                offset += t.elem_count();
            }
        }
        Ok(())
    }
}
