//! MPI between CPU ranks (OpenMPI or MPICH through the `mpi` crate). The
//! ranks come from the launcher (`srun --mpi=pmix`, `mpirun`); MPI's own
//! numbering must agree with what the environment said.

use super::{Collective, Ranks};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

pub struct Mpi {
    ranks: Ranks,
    world: SimpleCommunicator,
    library: String,
    // Last: dropping it finalizes MPI, after everything that uses it.
    _universe: Universe,
}

impl Mpi {
    pub fn init(ranks: Ranks) -> Result<Mpi> {
        // Only the main thread calls MPI (the loader thread never does).
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .context("MPI was already initialised in this process")?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        if (rank, size) != (ranks.rank, ranks.world_size) {
            bail!(
                "MPI says rank {rank} of {size}, the launcher's environment rank {} of {}: \
                 was the job started with srun --mpi=pmix (or pmi2) / mpirun?",
                ranks.rank,
                ranks.world_size
            );
        }
        let library = mpi::environment::library_version()
            .ok()
            // "Open MPI v4.1.4, package: …" / "MPICH Version: 4.0.2 …": the first part.
            .and_then(|v| v.split([',', '\n']).next().map(|l| l.trim().to_string()))
            .unwrap_or_else(|| "MPI".into());
        Ok(Mpi {
            ranks,
            world,
            library,
            _universe: universe,
        })
    }
}

/// The tensor's values on the host: f64 stays f64 (token counts), the rest travel as f32.
enum Host {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Host {
    fn of(t: &Tensor) -> Result<Host> {
        if !t.device().is_cpu() || t.rank() != 1 {
            bail!("MPI collectives take 1-D CPU tensors");
        }
        Ok(match t.dtype() {
            DType::F64 => Host::F64(t.to_vec1()?),
            _ => Host::F32(t.to_dtype(DType::F32)?.to_vec1()?),
        })
    }

    fn into_tensor(self, like: &Tensor) -> Result<Tensor> {
        let t = match self {
            Host::F32(v) => Tensor::from_vec(v, like.elem_count(), like.device())?,
            Host::F64(v) => Tensor::from_vec(v, like.elem_count(), like.device())?,
        };
        Ok(t.to_dtype(like.dtype())?)
    }
}

impl Collective for Mpi {
    fn ranks(&self) -> Ranks {
        self.ranks
    }

    fn describe(&self) -> String {
        self.library.clone()
    }

    fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor> {
        // MPI has no in-place all-reduce in this binding: sum into a second buffer.
        let sum = match Host::of(t)? {
            Host::F32(send) => {
                let mut recv = vec![0f32; send.len()];
                self.world
                    .all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
                Host::F32(recv)
            }
            Host::F64(send) => {
                let mut recv = vec![0f64; send.len()];
                self.world
                    .all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
                Host::F64(recv)
            }
        };
        sum.into_tensor(t)
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        let mut host = Host::of(t)?;
        let root = self.world.process_at_rank(root as i32);
        match &mut host {
            Host::F32(v) => root.broadcast_into(&mut v[..]),
            Host::F64(v) => root.broadcast_into(&mut v[..]),
        }
        host.into_tensor(t)
    }

    fn abort(&self, code: i32) {
        self.world.abort(code);
    }
}
