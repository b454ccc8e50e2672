//! How a step's gradients are summed across ranks: in buckets, in the order
//! the backward pass finishes them, during the backward pass where the
//! engine has a thread for it ([`super::Background`]), else after it.

use super::{Background, Collective, BUCKET_BYTES};
use crate::train::blockwise::Finished;
use crate::train::optim::Grads;
use anyhow::{Context, Result};
use candle_core::{DType, Tensor};

/// How a step's gradients travel: consecutive tensors, in the order the
/// backward pass finishes them, packed into buckets of at most
/// [`BUCKET_BYTES`] (a larger tensor travels alone). Overlapped and
/// blocking sums use the same buckets in the same order, so they make the
/// same calls with the same data: the same sums, bit for bit.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    /// Each bucket's tensors, as positions in the order given.
    pub groups: Vec<std::ops::Range<usize>>,
}

impl Buckets {
    pub fn plan(bytes: &[usize], bucket_bytes: usize) -> Buckets {
        let mut groups = Vec::new();
        let mut start = 0;
        while start < bytes.len() {
            let (mut end, mut size) = (start, 0);
            while end < bytes.len() && (end == start || size + bytes[end] <= bucket_bytes) {
                size += bytes[end];
                end += 1;
            }
            groups.push(start..end);
            start = end;
        }
        Buckets { groups }
    }
}

/// The tensors of one bucket, flattened and concatenated as f32 on the host.
pub fn pack(tensors: &[&Tensor]) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(tensors.iter().map(|t| t.elem_count()).sum());
    for t in tensors {
        out.extend(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?);
    }
    Ok(out)
}

/// Writes a bucket's sums back into its tensors (in their dtype and device).
pub fn unpack(sums: &[f32], tensors: &mut [&mut Tensor]) -> Result<()> {
    let mut offset = 0;
    for t in tensors.iter_mut() {
        let n = t.elem_count();
        let part = sums
            .get(offset..offset + n)
            .context("a bucket's sums are shorter than its tensors")?;
        **t = Tensor::from_slice(part, t.shape(), t.device())?.to_dtype(t.dtype())?;
        offset += n;
    }
    Ok(())
}

/// Sums `tensors` over all ranks in place, concatenated into buckets of at
/// most `bucket_bytes` (a tensor larger than that travels alone).
pub fn all_reduce_in_buckets(
    comm: &dyn Collective,
    tensors: &mut [&mut Tensor],
    bucket_bytes: usize,
) -> Result<()> {
    if comm.is_single() {
        return Ok(());
    }
    let bytes: Vec<usize> = tensors.iter().map(|t| size_of_tensor(t)).collect();
    for group in Buckets::plan(&bytes, bucket_bytes).groups {
        sum_bucket(comm, &mut tensors[group])?;
    }
    Ok(())
}

/// Sums one bucket's tensors over all ranks in place, as one concatenated
/// all-reduce.
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

/// The gradients in the order the backward pass finishes them — the head,
/// the blocks from the last, the embeddings — and their buckets: planned
/// once per run, the same on every rank.
pub struct GradientLayout {
    names: Vec<String>,
    /// When each tensor is finished.
    finished: Vec<Finished>,
    buckets: Buckets,
}

impl GradientLayout {
    pub fn new(grads: &Grads, n_layers: usize) -> GradientLayout {
        let stage = |name: &str| -> Finished {
            if name == "output.weight" || name == "norm.weight" {
                return Finished::Head;
            }
            name.strip_prefix("layers.")
                .and_then(|rest| rest.split('.').next())
                .and_then(|i| i.parse().ok())
                .map_or(Finished::Embeddings, Finished::Block)
        };
        let rank = |f: Finished| match f {
            Finished::Head => 0,
            Finished::Block(i) => 1 + n_layers.saturating_sub(i + 1),
            Finished::Embeddings => n_layers + 1,
        };
        let mut names: Vec<(usize, String, usize)> = grads
            .iter()
            .map(|(n, t)| (rank(stage(n)), n.clone(), size_of_tensor(t)))
            .collect();
        names.sort();
        let bytes: Vec<usize> = names.iter().map(|n| n.2).collect();
        GradientLayout {
            finished: names.iter().map(|n| stage(&n.1)).collect(),
            names: names.into_iter().map(|n| n.1).collect(),
            buckets: Buckets::plan(&bytes, BUCKET_BYTES),
        }
    }

    /// A step's sum: in the background where `comm` has one.
    pub fn begin<'a>(&'a self, comm: &dyn Collective) -> GradientSum<'a> {
        GradientSum {
            layout: self,
            background: if comm.is_single() {
                None
            } else {
                comm.background()
            },
            ready: vec![false; self.names.len()],
            started: 0,
        }
    }
}

/// One step's sum of the gradients across ranks.
pub struct GradientSum<'a> {
    layout: &'a GradientLayout,
    background: Option<Box<dyn Background>>,
    ready: Vec<bool>,
    /// Buckets handed to the background so far.
    started: usize,
}

impl GradientSum<'_> {
    /// The backward pass of the step's last micro-batch has finished these
    /// gradients: start summing every bucket that is now complete.
    pub fn finished(&mut self, f: Finished, grads: &Grads) -> Result<()> {
        let Some(bg) = self.background.as_mut() else {
            return Ok(());
        };
        let l = self.layout;
        for (ready, when) in self.ready.iter_mut().zip(&l.finished) {
            *ready |= *when == f;
        }
        while let Some(group) = l.buckets.groups.get(self.started) {
            if !self.ready[group.clone()].iter().all(|r| *r) {
                break;
            }
            let tensors = l.names[group.clone()]
                .iter()
                .map(|n| grads.get(n).context("a gradient the layout names"))
                .collect::<Result<Vec<_>>>()?;
            bg.start(pack(&tensors)?)?;
            self.started += 1;
        }
        Ok(())
    }

    /// Every gradient summed over the ranks, in place: waits for the
    /// background's buckets, or sums the same buckets now.
    pub fn finish(mut self, comm: &dyn Collective, grads: &mut Grads) -> Result<()> {
        if comm.is_single() {
            return Ok(());
        }
        let l = self.layout;
        let mut tensors = grads.ordered_mut(&l.names)?;
        let Some(mut bg) = self.background.take() else {
            for group in &l.buckets.groups {
                sum_bucket(comm, &mut tensors[group.clone()])?;
            }
            return Ok(());
        };
        // Buckets not finished by a hook (none when every stage was seen).
        for group in &l.buckets.groups[self.started..] {
            let refs: Vec<&Tensor> = tensors[group.clone()].iter().map(|t| &**t).collect();
            bg.start(pack(&refs)?)?;
        }
        let sums = bg.finish()?;
        for (group, sum) in l.buckets.groups.iter().zip(&sums) {
            unpack(sum, &mut tensors[group.clone()])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AttentionKind, ModelOverrides, Recompute};
    use crate::train::model::ModelSpec;

    #[test]
    fn buckets_are_consecutive_and_a_large_tensor_travels_alone() {
        let plan = |bytes: &[usize]| Buckets::plan(bytes, 10).groups;
        assert_eq!(
            plan(&[4, 4, 4, 20, 1, 9, 1]),
            [0..2, 2..3, 3..4, 4..6, 6..7]
        );
        assert_eq!(plan(&[]), Vec::<std::ops::Range<usize>>::new());
    }

    #[test]
    fn gradients_go_in_the_order_the_backward_pass_finishes_them() {
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
        let grads = Grads::buffers_for(&spec.init_params(1).unwrap()).unwrap();
        let layout = GradientLayout::new(&grads, 2);
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
    }
}
