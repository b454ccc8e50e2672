//! The device a run trains on: opening it, its name and its memory. On CUDA the memory is what
//! the driver reports in use (allocations, the pool's reserve, workspaces), sampled after each
//! backward pass.

pub use crate::config::runtime::CudaPool;
use anyhow::Result;
use candle_core::Device;

/// CUDA device `ordinal`, its pool as `pool` says. All GPU work goes on candle's one stream from
/// this thread, so cudarc's cross-stream tracking is off.
#[cfg(feature = "cuda")]
pub fn cuda(ordinal: usize, pool: CudaPool) -> Result<Device> {
    use anyhow::Context;
    use candle_core::cuda::cudarc::driver::CudaContext;
    let visible = match CudaContext::device_count() {
        Ok(n) => n.max(0) as usize,
        Err(e) => anyhow::bail!(
            "opening CUDA device {ordinal}: the CUDA driver cannot list this machine's GPUs ({e:?}): does `nvidia-smi` list one here, and does the job see it (a SLURM job needs `gpus_per_node`)?"
        ),
    };
    let ordinal = match (ordinal, visible) {
        (o, v) if o < v => o,
        (_, 1) => 0,
        (o, v) => anyhow::bail!(
            "local rank {o} has no CUDA device of its own: {v} are visible here (does `nvidia-smi` list them? a SLURM job needs `gpus_per_node`, one per task)"
        ),
    };
    let device = Device::new_cuda(ordinal).with_context(|| {
        format!(
            "opening CUDA device {ordinal} (does `nvidia-smi` list it here? a SLURM job needs `gpus_per_node`)"
        )
    })?;
    if let Device::Cuda(d) = &device {
        let stream = d.cuda_stream();
        let context = stream.context();
        // Before anything is allocated or compiled for the device.
        let cc = context.compute_capability().map_err(|e| {
            anyhow::anyhow!("reading CUDA device {ordinal}'s compute capability: {e:?}")
        })?;
        fit(driver_cuda(), nvrtc_cuda(), cc, built_for()).map_err(anyhow::Error::msg)?;
        // SAFETY: one stream, one thread: nothing to synchronise between streams.
        unsafe { context.disable_event_tracking() };
    }
    crate::train::network::ops::cuda::claim_gpu_thread();
    if pool == CudaPool::Keep {
        keep_freed_memory(&device)?;
    }
    Ok(device)
}

/// The CUDA version the driver supports, where it says.
#[cfg(feature = "cuda")]
fn driver_cuda() -> Option<(i32, i32)> {
    use candle_core::cuda::cudarc::driver::sys;
    let mut v = 0;
    // SAFETY: writes one int; the driver is loaded (the device is open).
    let ok = unsafe { sys::cuDriverGetVersion(&mut v) } == sys::CUresult::CUDA_SUCCESS;
    ok.then_some((v / 1000, v % 1000 / 10))
}

/// The CUDA version of the NVRTC linked in, where it says.
#[cfg(feature = "cuda")]
fn nvrtc_cuda() -> Option<(i32, i32)> {
    use candle_core::cuda::cudarc::nvrtc::sys;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    let ok =
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) } == sys::nvrtcResult::NVRTC_SUCCESS;
    ok.then_some((major, minor))
}

/// The architecture this build's flash-attention kernels target (`(9, 0)` for 90); None
/// without them.
pub fn built_for() -> Option<(i32, i32)> {
    if !cfg!(feature = "flash-attn") {
        return None;
    }
    let cap: i32 = option_env!("CUDA_COMPUTE_CAP")?.trim().parse().ok()?;
    Some((cap / 10, cap % 10))
}

/// Whether a GPU, its driver, NVRTC and flash attention's kernels work together (the driver at
/// NVRTC's major or newer, machine code for the GPU's); else one message naming all three.
pub fn fit(
    driver: Option<(i32, i32)>,
    nvrtc: Option<(i32, i32)>,
    device: (i32, i32),
    built: Option<(i32, i32)>,
) -> std::result::Result<(), String> {
    let mut wrong = Vec::new();
    let mut fixes = Vec::new();
    if let (Some(d), Some(n)) = (driver, nvrtc) {
        if d.0 < n.0 {
            wrong.push(format!(
                "its driver supports CUDA {}.{} and this build compiles its kernels with CUDA {}.{}'s NVRTC",
                d.0, d.1, n.0, n.1
            ));
            fixes.push(format!(
                "a driver for CUDA {}.x or later, or this build made with a CUDA {}.x toolkit",
                n.0, d.0
            ));
        }
    }
    if let Some(b) = built {
        if b.0 != device.0 || b.1 > device.1 {
            wrong.push(format!(
                "its flash-attention kernels are for sm_{}{} and the GPU is sm_{}{}",
                b.0, b.1, device.0, device.1
            ));
            fixes.push(format!(
                "scripts/build-gpu.sh --cap {}{}",
                device.0, device.1
            ));
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    let seen = |v: Option<(i32, i32)>| v.map_or("unknown".to_string(), |(a, b)| format!("{a}.{b}"));
    Err(format!(
        "this GPU (compute capability {}.{}, driver for CUDA {}) and this build (NVRTC {}, flash attention for {}) do not work together: {}; use {}",
        device.0,
        device.1,
        seen(driver),
        seen(nvrtc),
        built.map_or("no architecture: not built in".to_string(), |(a, b)| format!("sm_{a}{b}")),
        wrong.join("; "),
        fixes.join(", and ")
    ))
}

/// A build without the `cuda` feature: candle's error.
#[cfg(not(feature = "cuda"))]
pub fn cuda(ordinal: usize, _pool: CudaPool) -> Result<Device> {
    Ok(Device::new_cuda(ordinal)?)
}

/// The default memory pool of a CUDA device.
#[cfg(feature = "cuda")]
fn default_pool(
    d: &candle_core::CudaDevice,
) -> Result<candle_core::cuda::cudarc::driver::sys::CUmemoryPool> {
    use candle_core::cuda::cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the context's own device handle; `pool` receives the default pool's handle.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, d.cuda_stream().context().cu_device()) }
        .result()
        .map_err(|e| {
            anyhow::anyhow!("asking the CUDA driver for the device's memory pool: {e:?}")
        })?;
    Ok(pool)
}

/// Raises the pool's release threshold to its maximum: freed memory stays across syncs.
#[cfg(feature = "cuda")]
fn keep_freed_memory(device: &Device) -> Result<()> {
    use candle_core::cuda::cudarc::driver::sys;
    let Device::Cuda(d) = device else {
        return Ok(());
    };
    let pool = default_pool(d)?;
    let mut threshold = u64::MAX;
    // SAFETY: `pool` is the device's; the attribute takes a u64 by pointer.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    }
    .result()
    .map_err(|e| anyhow::anyhow!("setting the CUDA memory pool's release threshold: {e:?}"))
}

/// Hands the pool's unused memory back to the driver once queued work has finished; the bytes.
/// The reserve serves the pool only: cuBLAS's and NCCL's allocations need it back.
#[cfg(feature = "cuda")]
pub fn release_pool(device: &Device) -> Result<u64> {
    use candle_core::cuda::cudarc::driver::sys;
    let Device::Cuda(d) = device else {
        return Ok(0);
    };
    device.synchronize()?;
    let pool = default_pool(d)?;
    let reserved = || -> Result<u64> {
        let mut bytes = 0u64;
        // SAFETY: `pool` is the device's; the attribute is a u64.
        unsafe {
            sys::cuMemPoolGetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut bytes as *mut u64).cast(),
            )
        }
        .result()
        .map_err(|e| anyhow::anyhow!("asking the CUDA memory pool its reserve: {e:?}"))?;
        Ok(bytes)
    };
    let before = reserved()?;
    // SAFETY: `pool` is the device's; trimming keeps what backs live allocations.
    unsafe { sys::cuMemPoolTrimTo(pool, 0) }
        .result()
        .map_err(|e| anyhow::anyhow!("releasing the CUDA memory pool: {e:?}"))?;
    Ok(before.saturating_sub(reserved()?))
}

/// Without CUDA there is no pool to release.
#[cfg(not(feature = "cuda"))]
pub fn release_pool(_device: &Device) -> Result<u64> {
    Ok(0)
}

/// `attempt` once more after an out-of-memory where the pool had some to hand back (as
/// PyTorch's allocator does); only `alone`: one rank cannot rerun a step's collectives.
pub fn once_more_after_release<T>(
    device: &Device,
    alone: bool,
    mut attempt: impl FnMut() -> Result<T>,
) -> Result<T> {
    if !alone {
        return attempt();
    }
    retried(attempt, is_out_of_memory, || release_pool(device))
}

fn retried<T>(
    mut attempt: impl FnMut() -> Result<T>,
    short_of_memory: impl Fn(&anyhow::Error) -> bool,
    release: impl FnOnce() -> Result<u64>,
) -> Result<T> {
    match attempt() {
        Err(e) if short_of_memory(&e) => {
            let released = release()?;
            if released == 0 {
                return Err(e);
            }
            eprintln!(
                "sweep train: out of device memory ({e:#}); the memory pool handed {:.0} MB back, running the step again",
                released as f64 / 1e6
            );
            attempt()
        }
        done => done,
    }
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

/// Peak resident memory of this process, in MB.
pub fn peak_memory_mb() -> f64 {
    crate::util::process::proc_kb("/proc/self/status", "VmHWM").map_or(0.0, |kb| kb as f64 / 1024.0)
}

/// Memory in use on a GPU, in MB; `None` on the CPU ([`peak_memory_mb`]).
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

/// Whether an error is the device out of memory, by the chain's types.
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
            peak_memory_mb()
        } else {
            self.mb
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver too old for the build's NVRTC, a GPU of another
    /// architecture than the flash kernels': one message naming all three
    /// and the fix; a newer driver or minor architecture fits.
    #[test]
    fn a_gpu_driver_and_build_that_do_not_fit_are_said_at_once() {
        let h100 = (9, 0);
        assert_eq!(
            fit(Some((13, 0)), Some((13, 0)), h100, Some((9, 0))),
            Ok(())
        );
        assert_eq!(fit(Some((13, 1)), Some((12, 8)), h100, None), Ok(()));
        assert_eq!(
            fit(None, None, (8, 6), Some((8, 0))),
            Ok(()),
            "sm_80 code runs on 8.6"
        );
        let old = fit(Some((12, 4)), Some((13, 0)), h100, Some((9, 0))).unwrap_err();
        assert!(
            old.contains("driver supports CUDA 12.4 and this build compiles its kernels with CUDA 13.0's NVRTC")
                && old.contains("a driver for CUDA 13.x or later"),
            "{old}"
        );
        let b200 = fit(Some((13, 0)), Some((13, 0)), (10, 0), Some((9, 0))).unwrap_err();
        assert!(
            b200.contains("compute capability 10.0")
                && b200.contains("kernels are for sm_90 and the GPU is sm_100")
                && b200.contains("scripts/build-gpu.sh --cap 100"),
            "{b200}"
        );
        let both = fit(Some((12, 4)), Some((13, 0)), (8, 0), Some((9, 0))).unwrap_err();
        assert!(
            both.contains("driver for CUDA 12.4")
                && both.contains("NVRTC 13.0")
                && both.contains("sm_90"),
            "{both}"
        );
    }
    use std::cell::Cell;

    #[test]
    fn a_step_short_of_memory_runs_once_more_only_after_memory_was_handed_back() {
        let short = |e: &anyhow::Error| e.to_string() == "short";
        /// Fails short of memory first, then `again` (Ok where empty).
        fn fail_first<'a>(
            tries: &'a Cell<u32>,
            again: &'static str,
        ) -> impl FnMut() -> Result<u32> + 'a {
            move || {
                tries.set(tries.get() + 1);
                match tries.get() {
                    1 => anyhow::bail!("short"),
                    _ if again.is_empty() => Ok(tries.get()),
                    _ => anyhow::bail!(again),
                }
            }
        }
        // Released: once more, and that answer is the step's.
        let tries = Cell::new(0);
        assert_eq!(
            retried(fail_first(&tries, ""), short, || Ok(1 << 30)).unwrap(),
            2
        );
        let tries = Cell::new(0);
        let err = retried(fail_first(&tries, "short"), short, || Ok(1)).unwrap_err();
        assert_eq!((err.to_string(), tries.get()), ("short".into(), 2));
        // Nothing to hand back, or a release that failed: the first error
        // or the release's, and no second attempt.
        let tries = Cell::new(0);
        let err = retried(fail_first(&tries, ""), short, || Ok(0)).unwrap_err();
        assert_eq!((err.to_string(), tries.get()), ("short".into(), 1));
        let tries = Cell::new(0);
        let err = retried(fail_first(&tries, ""), short, || anyhow::bail!("no pool")).unwrap_err();
        assert_eq!((err.to_string(), tries.get()), ("no pool".into(), 1));
        // Another error: no release asked for.
        let tries = Cell::new(0);
        let err = retried(
            fail_first(&tries, ""),
            |_| false,
            || -> Result<u64> { panic!("released for an error that is not memory") },
        )
        .unwrap_err();
        assert_eq!((err.to_string(), tries.get()), ("short".into(), 1));
    }
}

#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::train::network::ops::cuda::typed;
    use candle_core::cuda::cudarc::cublas::{result::CublasError, sys::cublasStatus_t};
    use candle_core::cuda::cudarc::driver::{sys::CUresult, DriverError};

    #[test]
    fn out_of_memory_is_known_through_sweeps_own_kernels_and_gemms() {
        // As the cuBLAS weight gradient and a kernel launch report them,
        // under the contexts the trainer adds on the way up.
        let up = |e: candle_core::Error| anyhow::Error::from(e).context("a step");
        let gemm = typed(
            CublasError(cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED),
            "cuBLAS weight gradient".into(),
        );
        assert!(is_out_of_memory(&up(gemm)));
        let launch = up(typed(
            DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            "launching".into(),
        ));
        assert!(format!("{launch:#}").contains("launching"), "{launch:#}");
        assert!(is_out_of_memory(&launch));
        let other = typed(
            CublasError(cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE),
            "cuBLAS weight gradient".into(),
        );
        assert!(!is_out_of_memory(&up(other)));
    }
}
