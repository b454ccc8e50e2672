//! MPI between CPU ranks (the `mpi` crate); MPI's numbering must agree with the launcher's.

use super::{Background, Collective, Ranks, Reduce};
use anyhow::{bail, Context, Result};
use candle_core::{CpuStorage, DType, Layout, Tensor};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::sync::mpsc;

pub struct Mpi {
    ranks: Ranks,
    world: SimpleCommunicator,
    library: String,
    /// The thread summing buckets during the backward pass, on a duplicate of `world`.
    summer: Option<Summer>,
    /// Sum buckets after the backward pass (`SWEEP_BLOCKING_ALLREDUCE`: the same sums, bit for bit).
    blocking: bool,
    // Last: dropping it finalizes MPI, after everything that uses it.
    _universe: Universe,
}

impl Mpi {
    pub fn init(ranks: Ranks, blocking: bool) -> Result<Mpi> {
        // ZeRO's reduce-scatter by recursive halving (Open MPI 4.1 sends each bucket whole for few
        // ranks: docs/performance.md), set before MPI_Init; a setting already there wins.
        for (key, value) in [
            ("OMPI_MCA_coll_tuned_use_dynamic_rules", "1"),
            ("OMPI_MCA_coll_tuned_reduce_scatter_block_algorithm", "3"),
        ] {
            if std::env::var_os(key).is_none() {
                std::env::set_var(key, value);
            }
        }
        // The main thread and the summing thread call MPI, never both at once: serialized.
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
        // No rank sends before every rank is out of MPI_Init (meet.rs says why).
        if let Some(place) = super::meet::Place::from_env()? {
            if let Err(e) = super::meet::all_ranks(ranks, &place, super::meet::LIMIT) {
                // The ranks that met wait in MPI: end them all.
                eprintln!(
                    "sweep train: rank {}: {e:#}; stopping every rank",
                    ranks.rank
                );
                world.abort(1);
            }
        }
        let library = mpi::environment::library_version()
            .ok()
            // "Open MPI v4.1.4, package: …" / "MPICH Version: 4.0.2 …": the first part.
            .and_then(|v| v.split([',', '\n']).next().map(|l| l.trim().to_string()))
            .unwrap_or_else(|| "MPI".into());
        // Duplicating is collective: every rank does it here, once.
        let summer = (threading >= mpi::Threading::Serialized)
            .then(|| Summer::spawn(Handle(world.duplicate())))
            .transpose()?;
        Ok(Mpi {
            ranks,
            world,
            library,
            summer,
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
        Ok(recv.inplace_op2(send, &Collect(&self.world, Kind::Sum))?)
    }

    fn reduce_scatter_into(&self, send: &Tensor, recv: &Tensor) -> Result<()> {
        Ok(recv.inplace_op2(&f32_host(send)?, &Collect(&self.world, Kind::Scatter))?)
    }

    fn all_gather_into(&self, send: &Tensor, recv: &Tensor) -> Result<()> {
        Ok(recv.inplace_op2(&f32_host(send)?, &Collect(&self.world, Kind::Gather))?)
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
        let tx = self.summer.as_ref()?.tx.clone()?;
        Some(Box::new(MpiBackground { tx, open: true }))
    }

    fn overlaps(&self) -> bool {
        self.summer.is_some() && !self.blocking
    }
}

/// A communicator moved to the thread that sums buckets.
struct Handle(SimpleCommunicator);

// SAFETY: under MPI_THREAD_SERIALIZED any thread may call MPI while no other does: the summing
// thread calls it only between a step's first bucket and `finish`, when the main thread makes
// no MPI call (`Background`'s contract), and the channel orders the two.
unsafe impl Send for Handle {}

/// A bucket to sum, or a request to answer once every earlier bucket is summed.
enum Job {
    Sum(Tensor, Tensor, Reduce),
    Finish(mpsc::Sender<Result<()>>),
}

/// The summing thread: blocking all-reduces in order on its own communicator, overlapping the
/// main thread's compute.
struct Summer {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Summer {
    fn spawn(comm: Handle) -> Result<Summer> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("sweep-allreduce".into())
            .spawn(move || {
                let comm = comm;
                let mut failed = None;
                for job in rx {
                    match job {
                        Job::Sum(send, recv, how) if failed.is_none() => {
                            let kind = match how {
                                Reduce::All => Kind::Sum,
                                Reduce::Scatter => Kind::Scatter,
                            };
                            if let Err(e) = recv.inplace_op2(&send, &Collect(&comm.0, kind)) {
                                failed = Some(e.into());
                            }
                        }
                        Job::Sum(..) => {}
                        Job::Finish(answer) => {
                            let _ = answer.send(failed.take().map_or(Ok(()), Err));
                        }
                    }
                }
            })
            .context("starting the all-reduce thread")?;
        Ok(Summer {
            tx: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for Summer {
    /// Ends the thread before MPI is finalised.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One step's use of the summing thread.
struct MpiBackground {
    tx: mpsc::Sender<Job>,
    /// Buckets may be in flight: not yet finished.
    open: bool,
}

impl MpiBackground {
    /// Waits until every bucket handed over is summed.
    fn wait(&mut self) -> Result<()> {
        self.open = false;
        let (answer, answered) = mpsc::channel();
        self.tx
            .send(Job::Finish(answer))
            .map_err(|_| anyhow::anyhow!("the all-reduce thread stopped"))?;
        answered
            .recv()
            .map_err(|_| anyhow::anyhow!("the all-reduce thread stopped"))?
    }
}

impl Background for MpiBackground {
    fn start(&mut self, send: Tensor, recv: Tensor, how: Reduce) -> Result<()> {
        self.tx
            .send(Job::Sum(send, recv, how))
            .map_err(|_| anyhow::anyhow!("the all-reduce thread stopped"))
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        self.wait()
    }
}

impl Drop for MpiBackground {
    /// A step left early still waits for its buckets: the next MPI calls must not meet.
    fn drop(&mut self) {
        if self.open {
            let _ = self.wait();
        }
    }
}

/// `t` as an f32 tensor on the host (the f32 collectives' operand).
fn f32_host(t: &Tensor) -> Result<Tensor> {
    if !t.device().is_cpu() || t.rank() != 1 {
        bail!("MPI collectives take 1-D CPU tensors");
    }
    Ok(t.to_dtype(DType::F32)?)
}

/// What [`Collect`] does with the second tensor's data.
#[derive(Clone, Copy)]
enum Kind {
    /// The sum over the ranks (as long as the first).
    Sum,
    /// This rank's block of the sum (world size × the first's length).
    Scatter,
    /// Every rank's, by rank (the first is world size × as long).
    Gather,
}

/// An MPI collective from the second tensor's f32 data into the first's storage, as an in-place
/// op (candle holds the write lock).
struct Collect<'a>(&'a SimpleCommunicator, Kind);

impl candle_core::InplaceOp2 for Collect<'_> {
    fn name(&self) -> &'static str {
        "mpi-collective-into"
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
        let (recv, send) = (&mut recv[a..b], &send[c..d]);
        let world = self.0.size() as usize;
        let fits = match self.1 {
            Kind::Sum => send.len() == recv.len(),
            Kind::Scatter => send.len() == recv.len() * world,
            Kind::Gather => recv.len() == send.len() * world,
        };
        if !fits {
            candle_core::bail!(
                "an MPI collective of {} values into {} at world size {world}",
                send.len(),
                recv.len()
            )
        }
        match self.1 {
            Kind::Sum => self.0.all_reduce_into(send, recv, SystemOperation::sum()),
            Kind::Scatter => self
                .0
                .reduce_scatter_block_into(send, recv, SystemOperation::sum()),
            Kind::Gather => self.0.all_gather_into(send, recv),
        }
        Ok(())
    }
}
