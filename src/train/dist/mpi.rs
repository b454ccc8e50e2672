//! MPI between CPU ranks (OpenMPI or MPICH through the `mpi` crate). The
//! ranks come from the launcher (`srun --mpi=pmix`, `mpirun`); MPI's own
//! numbering must agree with what the environment said.

use super::{Background, Collective, Ranks};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::sync::Arc;

pub struct Mpi {
    ranks: Ranks,
    world: SimpleCommunicator,
    library: String,
    /// A duplicate of `world` for the thread that sums buckets during the
    /// backward pass, when MPI lets a second thread call it (never at the
    /// same time as the first).
    background: Option<Arc<Handle>>,
    // Last: dropping it finalizes MPI, after everything that uses it.
    _universe: Universe,
}

impl Mpi {
    pub fn init(ranks: Ranks) -> Result<Mpi> {
        // The main thread calls MPI, and during the backward pass a thread
        // of its own that sums gradient buckets ([`Mpi::background`]), never
        // both at once: serialized.
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Serialized)
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
        // Duplicating is collective: every rank does it here, once.
        let background =
            (threading >= mpi::Threading::Serialized).then(|| Arc::new(Handle(world.duplicate())));
        Ok(Mpi {
            ranks,
            world,
            library,
            background,
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

    fn background(&self) -> Option<Box<dyn Background>> {
        if !self.overlaps() {
            return None;
        }
        let comm = Arc::clone(self.background.as_ref()?);
        Some(Box::new(MpiBackground::spawn(comm)))
    }

    fn overlaps(&self) -> bool {
        self.background.is_some() && std::env::var_os(BLOCKING).is_none()
    }
}

/// Set (to anything) to sum every bucket after the backward pass instead of
/// during it (to compare: the sums are the same, bit for bit).
pub const BLOCKING: &str = "SWEEP_BLOCKING_ALLREDUCE";

/// A communicator moved to the thread that sums buckets.
struct Handle(SimpleCommunicator);

// SAFETY: MPI was initialised with MPI_THREAD_SERIALIZED, which lets any
// thread use a communicator as long as no two call MPI at once: the main
// thread makes no MPI call between starting the summing thread and joining
// it (`Background`'s contract).
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

/// Sums buckets with blocking all-reduces, in order, on a thread of its own:
/// the progress thread that lets them overlap the caller's computing.
struct MpiBackground {
    tx: Option<std::sync::mpsc::Sender<Vec<f32>>>,
    thread: std::thread::JoinHandle<Vec<Vec<f32>>>,
}

impl MpiBackground {
    fn spawn(comm: Arc<Handle>) -> MpiBackground {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<f32>>();
        let thread = std::thread::Builder::new()
            .name("sweep-allreduce".into())
            .spawn(move || {
                let comm = comm;
                rx.into_iter()
                    .map(|send| {
                        let mut recv = vec![0f32; send.len()];
                        comm.0
                            .all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
                        recv
                    })
                    .collect()
            })
            .expect("spawning the all-reduce thread");
        MpiBackground {
            tx: Some(tx),
            thread,
        }
    }
}

impl Background for MpiBackground {
    fn start(&mut self, bucket: Vec<f32>) -> Result<()> {
        self.tx
            .as_ref()
            .expect("open until finish")
            .send(bucket)
            .map_err(|_| anyhow::anyhow!("the all-reduce thread stopped"))
    }

    fn finish(mut self: Box<Self>) -> Result<Vec<Vec<f32>>> {
        drop(self.tx.take());
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the all-reduce thread panicked"))
    }
}
