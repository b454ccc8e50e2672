//! Data parallelism: one process per rank, each training its slice of every batch, gradients
//! summed by a real engine ([`GradientSum`]): MPI between CPU ranks (`mpi`), NCCL between GPUs
//! (`nccl`). The launcher starts the ranks; this module reads who it is and connects.

pub mod agree;
pub(crate) mod buckets;
pub mod meet;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
pub mod shard;

use crate::config::RuntimeOptions;
use anyhow::{bail, Result};
pub use buckets::{all_reduce_in_buckets, GradientLayout, GradientSum};
use candle_core::{DType, Device, Tensor};
pub use shard::Sharded;

/// Where this process stands among the ranks of its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ranks {
    pub rank: usize,
    pub world_size: usize,
    /// The rank's index on its node (which GPU it drives).
    pub local_rank: usize,
}

/// The variables that name a rank, in the order trusted: sweep's scripts and torchrun
/// (`RANK`), OpenMPI's and MPICH's launchers, then `srun`.
const LAUNCHERS: &[(&str, &str, &str)] = &[
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
    ),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
];

impl Ranks {
    pub const SINGLE: Ranks = Ranks {
        rank: 0,
        world_size: 1,
        local_rank: 0,
    };

    /// From the launcher's environment; one rank when no launcher says otherwise.
    pub fn from_env() -> Result<Ranks> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Ranks> {
        let num = |k: &str| -> Result<Option<usize>> {
            match get(k) {
                None => Ok(None),
                Some(v) => match v.trim().parse() {
                    Ok(n) => Ok(Some(n)),
                    Err(_) => bail!("{k}={v:?} is not a number"),
                },
            }
        };
        // WORLD_SIZE alone (set by the job script, the rank left to MPI) counts too.
        let world_hint = num("WORLD_SIZE")?;
        for (rank, size, local) in LAUNCHERS {
            let Some(r) = num(rank)? else { continue };
            let world = num(size)?.or(world_hint).unwrap_or(1);
            let local_rank = num(local)?.unwrap_or(if world == 1 { 0 } else { r });
            if world == 0 || r >= world {
                bail!("{rank}={r} is not below the world size {world}");
            }
            return Ok(Ranks {
                rank: r,
                world_size: world,
                local_rank,
            });
        }
        match world_hint {
            None | Some(1) => Ok(Ranks::SINGLE),
            Some(w) => bail!("WORLD_SIZE={w} but no launcher named this process's rank (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID): start the ranks with srun or mpirun"),
        }
    }

    pub fn is_main(&self) -> bool {
        self.rank == 0
    }
}

/// A collective engine over the job's ranks: every rank calls the same operations in the same
/// order; a dead rank makes the others' calls fail or the launcher stop the job (never a hang).
pub trait Collective {
    fn ranks(&self) -> Ranks;
    /// The engine, for logs ("MPI (Open MPI v4.1.4)", "NCCL 2.27").
    fn describe(&self) -> String;
    /// The element-wise sum over all ranks of a 1-D tensor, on every rank.
    fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor>;
    /// The sum over ranks of `send` (1-D) into `recv`, contiguous, same length and dtype, no shared
    /// storage.
    fn all_reduce_into(&self, send: &Tensor, recv: &Tensor) -> Result<()> {
        Ok(recv.slice_set(&self.all_reduce_sum(send)?, 0, 0)?)
    }
    /// This rank's block of the sum of `send` (world size × `recv`'s length) into `recv` (ZeRO).
    fn reduce_scatter_into(&self, send: &Tensor, recv: &Tensor) -> Result<()> {
        let n = recv.elem_count();
        let sum = self.all_reduce_sum(send)?;
        Ok(recv.slice_set(&sum.narrow(0, self.ranks().rank * n, n)?, 0, 0)?)
    }
    /// Every rank's `send` (equal lengths), by rank, into `recv` (ZeRO's all-gather).
    fn all_gather_into(&self, send: &Tensor, recv: &Tensor) -> Result<()> {
        let n = send.elem_count();
        let slots = recv.zeros_like()?;
        slots.slice_set(send, 0, self.ranks().rank * n)?;
        Ok(recv.slice_set(&self.all_reduce_sum(&slots)?, 0, 0)?)
    }
    /// Rank `root`'s copy of a 1-D tensor, on every rank.
    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor>;
    /// Stops every rank of the job after an error on this one.
    fn abort(&self, code: i32);
    /// A thread summing f32 buckets in order while the caller computes, if the engine has one; no
    /// other collective call until [`Background::finish`].
    fn background(&self) -> Option<Box<dyn Background>> {
        None
    }
    /// Whether [`Collective::background`] gives a thread.
    fn overlaps(&self) -> bool {
        false
    }
    /// No engine: every collective is the identity, so callers skip them.
    fn is_single(&self) -> bool {
        false
    }
}

/// World size 1: every collective is the identity.
pub struct Single;

impl Collective for Single {
    fn ranks(&self) -> Ranks {
        Ranks::SINGLE
    }
    fn describe(&self) -> String {
        "none (one rank)".into()
    }
    fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.clone())
    }
    fn broadcast(&self, t: &Tensor, _root: usize) -> Result<Tensor> {
        Ok(t.clone())
    }
    fn abort(&self, _code: i32) {}
    fn is_single(&self) -> bool {
        true
    }
}

/// Connects to the job's ranks with `device`'s engine (at world size 1 too with `engine_at_one`).
pub fn connect(ranks: Ranks, device: &Device, rt: &RuntimeOptions) -> Result<Box<dyn Collective>> {
    if ranks.world_size == 1 && !rt.engine_at_one {
        return Ok(Box::new(Single));
    }
    if device.is_cpu() {
        #[cfg(feature = "mpi")]
        return Ok(Box::new(mpi::Mpi::init(ranks, rt.blocking_allreduce)?));
        #[cfg(not(feature = "mpi"))]
        bail!("{} ranks on the CPU need a build with the `mpi` feature (cargo build --release --features mpi; see docs/data-parallelism.md)", ranks.world_size);
    }
    #[cfg(feature = "nccl")]
    return Ok(Box::new(nccl::Nccl::init(ranks, device)?));
    #[cfg(not(feature = "nccl"))]
    bail!("{} ranks on GPUs need a build with the `nccl` feature (scripts/build-gpu.sh; see docs/data-parallelism.md)", ranks.world_size)
}

/// The most a bucket holds (PyTorch DDP's default): few calls, bounded memory.
pub const BUCKET_BYTES: usize = crate::estimate::scaling::BUCKET_BYTES;

/// How a bucket is summed: whole on every rank, or each rank its block (reduce-scatter, ZeRO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    All,
    Scatter,
}

/// Sums f32 buckets over all ranks on a thread of its own.
pub trait Background {
    /// Starts summing `send` into `recv` after the buckets before; both untouched until `finish`.
    fn start(&mut self, send: Tensor, recv: Tensor, how: Reduce) -> Result<()>;
    /// Returns once every bucket started is summed.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// The sums of a few numbers over all ranks, in f64 so counts stay exact.
pub fn sum_scalars<const N: usize>(
    comm: &dyn Collective,
    xs: [f64; N],
    device: &Device,
) -> Result<[f64; N]> {
    if comm.is_single() {
        return Ok(xs);
    }
    let s = comm.all_reduce_sum(&Tensor::new(&xs, device)?)?;
    let v = s.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    Ok(std::array::from_fn(|i| v[i]))
}

/// Returns once every rank has called it.
pub fn barrier(comm: &dyn Collective, device: &Device) -> Result<()> {
    sum_scalars(comm, [0.0], device).map(|_| ())
}

/// Every rank's `mine` by rank on every rank: each fills its own slots and the sum gathers them.
fn gather(comm: &dyn Collective, mine: &[f64], device: &Device) -> Result<Vec<f64>> {
    let Ranks {
        rank, world_size, ..
    } = comm.ranks();
    let mut slots = vec![0.0; world_size * mine.len()];
    slots[rank * mine.len()..(rank + 1) * mine.len()].copy_from_slice(mine);
    if comm.is_single() {
        return Ok(slots);
    }
    let s = comm.all_reduce_sum(&Tensor::new(slots.as_slice(), device)?)?;
    Ok(s.to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

/// One number from every rank, by rank, on every rank.
pub fn gather_scalar(comm: &dyn Collective, x: f64, device: &Device) -> Result<Vec<f64>> {
    gather(comm, &[x], device)
}

/// The longest host name gathered; longer ones are cut (Linux allows 64 bytes).
const HOST_BYTES: usize = 64;

/// Every rank's host name, by rank, on every rank (its bytes gathered as numbers).
pub fn gather_hosts(comm: &dyn Collective, device: &Device) -> Result<Vec<String>> {
    let mut mine = [0.0f64; HOST_BYTES];
    for (slot, b) in mine
        .iter_mut()
        .zip(crate::util::process::host_name().bytes())
    {
        *slot = b as f64;
    }
    Ok(gather(comm, &mine, device)?
        .chunks(HOST_BYTES)
        .map(|c| {
            let bytes: Vec<u8> = c
                .iter()
                .map(|&x| x.clamp(0.0, 255.0) as u8)
                .take_while(|&b| b != 0)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn ranks(vars: &[(&str, &str)]) -> Result<Ranks> {
        Ranks::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn ranks_come_from_the_launcher_that_set_them() {
        assert_eq!(ranks(&[]).unwrap(), Ranks::SINGLE);
        assert_eq!(ranks(&[("WORLD_SIZE", "1")]).unwrap(), Ranks::SINGLE);
        let r = ranks(&[("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1")]).unwrap();
        assert_eq!((r.rank, r.world_size, r.local_rank), (3, 4, 1));
        // The local executor sets WORLD_SIZE and leaves the rank to mpirun.
        let r = ranks(&[
            ("WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ])
        .unwrap();
        assert_eq!((r.rank, r.world_size, r.local_rank), (1, 2, 1));
        let r = ranks(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
        ])
        .unwrap();
        assert_eq!((r.rank, r.world_size, r.local_rank), (5, 8, 1));
        for (vars, msg) in [
            (&[("WORLD_SIZE", "2")][..], "no launcher"),
            (&[("RANK", "2"), ("WORLD_SIZE", "2")][..], "not below"),
            (&[("RANK", "x")][..], "not a number"),
        ] {
            let e = ranks(vars).unwrap_err().to_string();
            assert!(e.contains(msg), "{vars:?}: {e}");
        }
    }

    /// A stand-in engine, rank 0 of two: its "sum" of a tensor is `sum` of
    /// it (the other rank's share planted), and it counts its calls.
    type Sum = Box<dyn Fn(&Tensor) -> candle_core::Result<Tensor>>;

    pub(super) struct Peer {
        pub(super) sum: Sum,
        pub(super) calls: std::cell::Cell<usize>,
    }

    impl Peer {
        pub(super) fn new(sum: impl Fn(&Tensor) -> candle_core::Result<Tensor> + 'static) -> Peer {
            Peer {
                sum: Box::new(sum),
                calls: Default::default(),
            }
        }

        /// For the bucketing alone: four times the input.
        pub(super) fn doubled() -> Peer {
            Peer::new(|t| t * 4.0)
        }
    }

    impl Collective for Peer {
        fn ranks(&self) -> Ranks {
            Ranks {
                rank: 0,
                world_size: 2,
                local_rank: 0,
            }
        }
        fn describe(&self) -> String {
            "a peer".into()
        }
        fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor> {
            assert_eq!(t.rank(), 1);
            self.calls.set(self.calls.get() + 1);
            Ok((self.sum)(t)?)
        }
        fn broadcast(&self, t: &Tensor, _root: usize) -> Result<Tensor> {
            Ok(t.clone())
        }
        fn abort(&self, _code: i32) {}
    }

    #[test]
    fn buckets_hold_whole_tensors_and_shapes_come_back() -> Result<()> {
        let dev = Device::Cpu;
        let shapes: [&[usize]; 4] = [&[3, 4], &[5], &[2, 2, 2], &[100]];
        let originals = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Tensor::arange(0f32, s.iter().product::<usize>() as f32, &dev)?
                    .affine(1.0, i as f64)?
                    .reshape(*s)
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut ts = originals.clone();
        let comm = Peer::doubled();
        // 90 bytes: [3,4]+[5] = 68 bytes fit, [2,2,2] (32 more) starts a new
        // bucket, [100] (400 bytes) travels alone.
        all_reduce_in_buckets(&comm, &mut ts.iter_mut().collect::<Vec<_>>(), 90)?;
        assert_eq!(comm.calls.get(), 3);
        for (a, b) in ts.iter().zip(&originals) {
            assert_eq!(a.dims(), b.dims());
            let want = (b * 4.0)?.flatten_all()?.to_vec1::<f32>()?;
            assert_eq!(a.flatten_all()?.to_vec1::<f32>()?, want);
        }
        Ok(())
    }
}
