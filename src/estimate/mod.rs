//! What sweep estimates and measures against, in one place: the devices'
//! peaks (FLOP/s, memory, links), FLOPs and MFU (one formula), the memory a
//! run needs at plan time and the scaling forecast of data-parallel runs.
//! Planning, the trainer and the report all read them here; `config` keeps
//! what a run is.

pub mod devices;
pub mod memory;
pub mod scaling;

/// MFU (%): a rate of FLOP/s over the device's `peak` FLOP/s. Above 100%
/// it is returned as computed: the rate is right even when the peak it is
/// divided by is not.
pub fn mfu_pct(flops_per_second: f64, peak: f64) -> f64 {
    100.0 * flops_per_second / peak
}

/// TFLOP/s and MFU (%) of a throughput: `tokens_per_second` ×
/// `flops_per_token` FLOP/s, its MFU where the device's `peak` is known.
/// What the trainer's metrics and the report's figures for other programs
/// share.
pub fn flops(
    tokens_per_second: f64,
    flops_per_token: f64,
    peak: Option<f64>,
) -> (f64, Option<f64>) {
    let rate = tokens_per_second * flops_per_token;
    (rate / 1e12, peak.map(|p| mfu_pct(rate, p)))
}
