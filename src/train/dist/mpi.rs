//! MPI between CPU ranks (OpenMPI or MPICH through the `mpi` crate). The
//! ranks come from the launcher (`srun --mpi=pmix`, `mpirun`); MPI's own
//! numbering must agree with what the environment said.

use super::{Background, Collective, Ranks};
use anyhow::{bail, Context, Result};
use candle_core::{CpuStorage, DType, Layout, Tensor};
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
    /// Sum buckets after the backward pass even where MPI allows a thread
    /// (`SWEEP_BLOCKING_ALLREDUCE`, to compare: the sums are the same, bit
    /// for bit).
    blocking: bool,
    // Last: dropping it finalizes MPI, after everything that uses it.
    _universe: Universe,
}

impl Mpi {
    pub fn init(ranks: Ranks, blocking: bool) -> Result<Mpi> {
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
            blocking,
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

    fn all_reduce_into(&self, send: &Tensor, recv: &Tensor) -> Result<()> {
        let f32_cpu = |t: &Tensor| t.dtype() == DType::F32 && t.device().is_cpu() && t.rank() == 1;
        if !f32_cpu(send) || !f32_cpu(recv) {
            return Ok(recv.slice_set(&self.all_reduce_sum(send)?, 0, 0)?);
        }
        Ok(recv.inplace_op2(send, &SumInto(&self.world))?)
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
        self.background.is_some() && !self.blocking
    }
}

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
    tx: Option<std::sync::mpsc::Sender<(Tensor, Tensor)>>,
    thread: std::thread::JoinHandle<Result<()>>,
}

impl MpiBackground {
    fn spawn(comm: Arc<Handle>) -> MpiBackground {
        let (tx, rx) = std::sync::mpsc::channel::<(Tensor, Tensor)>();
        let thread = std::thread::Builder::new()
            .name("sweep-allreduce".into())
            .spawn(move || {
                let comm = comm;
                rx.into_iter()
                    .try_for_each(|(send, recv)| Ok(recv.inplace_op2(&send, &SumInto(&comm.0))?))
            })
            .expect("spawning the all-reduce thread");
        MpiBackground {
            tx: Some(tx),
            thread,
        }
    }
}

impl Background for MpiBackground {
    fn start(&mut self, send: Tensor, recv: Tensor) -> Result<()> {
        self.tx
            .as_ref()
            .expect("open until finish")
            .send((send, recv))
            .map_err(|_| anyhow::anyhow!("the all-reduce thread stopped"))
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        drop(self.tx.take());
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the all-reduce thread panicked"))?
    }
}

/// MPI's sum of the f32 data of the second tensor into the first's storage,
/// as an in-place op: candle holds the destination's write lock meanwhile.
struct SumInto<'a>(&'a SimpleCommunicator);

impl candle_core::InplaceOp2 for SumInto<'_> {
    fn name(&self) -> &'static str {
        "mpi-all-reduce-into"
    }

    fn cpu_fwd(
        &self,
        recv: &mut CpuStorage,
        l_recv: &Layout,
        send: &CpuStorage,
        l_send: &Layout,
    ) -> candle_core::Result<()> {
        let (CpuStorage::F32(recv), CpuStorage::F32(send)) = (recv, send) else {
            candle_core::bail!("MPI sums f32 buffers into f32 buffers")
        };
        let (Some((a, b)), Some((c, d))) =
            (l_recv.contiguous_offsets(), l_send.contiguous_offsets())
        else {
            candle_core::bail!("MPI sums contiguous buffers")
        };
        if b - a != d - c {
            candle_core::bail!("summing {} values into {}", d - c, b - a)
        }
        self.0
            .all_reduce_into(&send[c..d], &mut recv[a..b], SystemOperation::sum());
        Ok(())
    }
}
