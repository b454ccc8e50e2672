//! The device a run trains on: opening it, its name (for the peak-FLOPs
//! table and the report) and the memory it holds. On CUDA both come from the
//! driver; the memory is what the driver reports in use on the device (this
//! process's allocations, its memory pool's reserve and workspaces),
//! sampled after each backward pass, when activations and gradients are
//! both alive.

pub use crate::config::runtime::CudaPool;
use anyhow::Result;
use candle_core::Device;

/// CUDA device `ordinal`, its memory pool set as `pool` says
/// (`SWEEP_CUDA_POOL`).
#[cfg(feature = "cuda")]
pub fn cuda(ordinal: usize, pool: CudaPool) -> Result<Device> {
    let device = Device::new_cuda(ordinal)?;
    if pool == CudaPool::Keep {
        keep_freed_memory(&device)?;
    }
    Ok(device)
}

/// A build without the `cuda` feature: candle's error.
#[cfg(not(feature = "cuda"))]
pub fn cuda(ordinal: usize, _pool: CudaPool) -> Result<Device> {
    Ok(Device::new_cuda(ordinal)?)
}

/// Raises the release threshold of the device's default memory pool (where
/// cudarc's stream-ordered allocations come from) to its maximum, so that
/// freed memory stays in the pool across synchronisations.
#[cfg(feature = "cuda")]
fn keep_freed_memory(device: &Device) -> Result<()> {
    use candle_core::cuda::cudarc::driver::sys;
    let Device::Cuda(d) = device else {
        return Ok(());
    };
    let context = d.cuda_stream().context().clone();
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: the device handle is the context's own; `pool` receives the
    // default pool's handle, and the attribute takes a u64 by pointer.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, context.cu_device())
            .result()
            .and_then(|()| {
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                )
                .result()
            })
    }
    .map_err(|e| anyhow::anyhow!("setting the CUDA memory pool's release threshold: {e:?}"))
}

/// `NVIDIA H100 80GB HBM3`, or `cpu`.
pub fn name(device: &Device) -> Result<String> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => d
            .cuda_stream()
            .context()
            .name()
            .map_err(|e| anyhow::anyhow!("asking the CUDA driver for the device name: {e:?}")),
        _ => Ok("cpu".into()),
    }
}

/// Memory in use on a GPU, in MB; `None` on the CPU (see
/// [`super::metrics::peak_memory_mb`] for the process's peak there).
pub fn memory_used_mb(device: &Device) -> Result<Option<f64>> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            let (free, total) =
                d.cuda_stream().context().mem_get_info().map_err(|e| {
                    anyhow::anyhow!("asking the CUDA driver for free memory: {e:?}")
                })?;
            Ok(Some((total - free) as f64 / (1024.0 * 1024.0)))
        }
        _ => Ok(None),
    }
}

/// Whether an error is the device running out of memory: CUDA's allocator
/// (or cuBLAS's) refusing, found by the errors' types anywhere in the chain.
/// On the CPU an allocation that fails aborts the process instead (SIGABRT),
/// and the kernel's OOM killer sends SIGKILL: callers read the exit status.
pub fn is_out_of_memory(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<candle_core::Error>()
            .is_some_and(candle_out_of_memory)
    })
}

fn candle_out_of_memory(e: &candle_core::Error) -> bool {
    use candle_core::Error as E;
    match e {
        E::Context { inner, .. } | E::WithPath { inner, .. } | E::WithBacktrace { inner, .. } => {
            candle_out_of_memory(inner)
        }
        #[cfg(feature = "cuda")]
        E::Cuda(inner) => {
            use candle_core::cuda::cudarc::cublas::{result::CublasError, sys::cublasStatus_t};
            use candle_core::cuda::cudarc::driver::{sys::CUresult, DriverError};
            use candle_core::cuda::CudaError;
            let driver = |d: &DriverError| d.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY;
            let cublas = |c: &CublasError| c.0 == cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED;
            match inner.downcast_ref::<CudaError>() {
                Some(CudaError::Cuda(d)) => driver(d),
                Some(CudaError::Cublas(c)) => cublas(c),
                _ => inner.downcast_ref::<DriverError>().is_some_and(driver),
            }
        }
        _ => false,
    }
}

/// The largest memory use seen so far on a device.
#[derive(Debug, Default)]
pub struct PeakMemory {
    mb: f64,
}

impl PeakMemory {
    /// Samples the device now (no-op on the CPU).
    pub fn sample(&mut self, device: &Device) -> Result<()> {
        if let Some(mb) = memory_used_mb(device)? {
            self.mb = self.mb.max(mb);
        }
        Ok(())
    }

    /// The device's peak on a GPU, the process's peak resident memory on the CPU.
    pub fn peak_mb(&self, device: &Device) -> f64 {
        if device.is_cpu() {
            super::metrics::peak_memory_mb()
        } else {
            self.mb
        }
    }
}
