//! The device a run trains on: its name (for the peak-FLOPs table and the
//! report) and the memory it holds. On CUDA both come from the driver; the
//! memory is what the driver reports in use on the device (this process's
//! allocations, pools and workspaces), sampled after each backward pass,
//! when activations and gradients are both alive.

use anyhow::Result;
use candle_core::Device;

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
