//! NCCL between GPUs (cudarc's bindings, one rank per GPU). The ranks agree
//! on the communicator's id through `NCCL_COMM_ID=<host>:<port>`, taken from
//! the job script's `MASTER_ADDR` and `MASTER_PORT` (the first node of the
//! allocation) unless set: with it, every rank's `ncclGetUniqueId` returns
//! the same id, so no side channel is needed.
//!
//! The collectives run as candle custom ops, so gradients stay on the GPU
//! and on candle's stream.

use super::{Collective, Ranks};
use anyhow::{bail, Context, Result};
use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::nccl::safe::{Comm, Id, NcclType, ReduceOp};
use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};

pub struct Nccl {
    ranks: Ranks,
    comm: Comm,
}

impl Nccl {
    pub fn init(ranks: Ranks, device: &Device) -> Result<Nccl> {
        if std::env::var_os("NCCL_COMM_ID").is_none() {
            match (std::env::var("MASTER_ADDR"), std::env::var("MASTER_PORT")) {
                // Before NCCL reads it; no other thread reads the environment yet.
                (Ok(addr), Ok(port)) => std::env::set_var("NCCL_COMM_ID", format!("{addr}:{port}")),
                _ => bail!("{} GPU ranks need NCCL_COMM_ID=<host>:<port>, or MASTER_ADDR and MASTER_PORT, in every rank's environment (sweep's job scripts set the latter)", ranks.world_size),
            }
        }
        let stream = device.as_cuda_device()?.cuda_stream();
        let id = Id::new().map_err(|e| anyhow::anyhow!("ncclGetUniqueId: {e:?}"))?;
        let comm = Comm::from_rank(stream, ranks.rank, ranks.world_size, id)
            .map_err(|e| {
                anyhow::anyhow!(
                    "ncclCommInitRank (rank {} of {}): {e:?}",
                    ranks.rank,
                    ranks.world_size
                )
            })
            .context(
                "is libnccl.so.2 on LD_LIBRARY_PATH and the same NCCL_COMM_ID set for every rank?",
            )?;
        Ok(Nccl { ranks, comm })
    }
}

enum Op {
    AllReduceSum,
    Broadcast(i32),
    /// This rank's block of the sum (1/world of the input).
    ReduceScatterSum(usize),
    /// Every rank's input, by rank (world × the input).
    AllGather(usize),
}

struct Collect<'a> {
    comm: &'a Comm,
    op: Op,
}

impl Collect<'_> {
    fn run<
        T: NcclType + candle_core::cuda::CudaDType + candle_core::cuda::cudarc::driver::DeviceRepr,
    >(
        &self,
        s: &CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("NCCL collectives take contiguous tensors")
        };
        let src = s.as_cuda_slice::<T>()?.slice(start..end);
        let dev = s.device.clone();
        let n = end - start;
        let out = match self.op {
            Op::ReduceScatterSum(world) if n % world != 0 => {
                candle_core::bail!("a reduce-scatter of {n} values over {world} ranks")
            }
            Op::ReduceScatterSum(world) => n / world,
            Op::AllGather(world) => n * world,
            Op::AllReduceSum | Op::Broadcast(_) => n,
        };
        // SAFETY: every element is written by the collective before it is read.
        let mut dst = unsafe { dev.alloc::<T>(out)? };
        let done = match self.op {
            Op::AllReduceSum => self.comm.all_reduce(&src, &mut dst, &ReduceOp::Sum),
            Op::Broadcast(root) => self.comm.broadcast(Some(&src), &mut dst, root),
            Op::ReduceScatterSum(_) => self.comm.reduce_scatter(&src, &mut dst, &ReduceOp::Sum),
            Op::AllGather(_) => self.comm.all_gather(&src, &mut dst),
        };
        done.map_err(|e| candle_core::Error::Msg(format!("NCCL: {e:?}")))?;
        let shape = match self.op {
            Op::AllReduceSum | Op::Broadcast(_) => l.shape().clone(),
            Op::ReduceScatterSum(_) | Op::AllGather(_) => Shape::from(out),
        };
        Ok((CudaStorage::wrap_cuda_slice(dst, dev), shape))
    }
}

impl CustomOp1 for Collect<'_> {
    fn name(&self) -> &'static str {
        "nccl-collective"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("NCCL collectives run on GPU tensors")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        match s.dtype() {
            DType::F32 => self.run::<f32>(s, l),
            DType::BF16 => self.run::<half::bf16>(s, l),
            DType::F64 => self.run::<f64>(s, l),
            dt => candle_core::bail!("NCCL collectives here take f32, bf16 or f64, not {dt:?}"),
        }
    }
}

impl Collective for Nccl {
    fn ranks(&self) -> Ranks {
        self.ranks
    }

    fn describe(&self) -> String {
        "NCCL".into()
    }

    fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor> {
        let op = Collect {
            comm: &self.comm,
            op: Op::AllReduceSum,
        };
        Ok(t.apply_op1_no_bwd(&op)?)
    }

    fn reduce_scatter_into(&self, send: &Tensor, recv: &Tensor) -> Result<()> {
        let op = Collect {
            comm: &self.comm,
            op: Op::ReduceScatterSum(self.ranks.world_size),
        };
        Ok(recv.slice_set(&send.apply_op1_no_bwd(&op)?, 0, 0)?)
    }

    fn all_gather_into(&self, send: &Tensor, recv: &Tensor) -> Result<()> {
        let op = Collect {
            comm: &self.comm,
            op: Op::AllGather(self.ranks.world_size),
        };
        Ok(recv.slice_set(&send.apply_op1_no_bwd(&op)?, 0, 0)?)
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        let op = Collect {
            comm: &self.comm,
            op: Op::Broadcast(root as i32),
        };
        Ok(t.apply_op1_no_bwd(&op)?)
    }

    fn abort(&self, _code: i32) {
        // Dropping the communicator aborts it (ncclCommAbort); srun's
        // --kill-on-bad-exit stops the other ranks.
    }
}
