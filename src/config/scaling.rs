//! The scaling forecast of a data-parallel run: how long summing the
//! gradients takes against how long the step computes, before anything is
//! queued.
//!
//! - **Compute**: the step's FLOPs on one device (`flops_per_token` × its
//!   tokens) at the expected MFU (`expected_mfu_pct`, default 40%).
//! - **All-reduce**: a ring over the W ranks moves 2(W−1)/W of the gradient
//!   bytes through each device's slowest link (within a node while W fits in
//!   one, the network otherwise; the device table's bandwidths, overridable),
//!   and pays a hop's latency 2(W−1) times per bucket.
//! - **Overlap**: a trainer that sums buckets during the backward pass hides
//!   the bandwidth time behind the backward's device work — two thirds of the
//!   step's FLOPs, at no slower than the MFU of a step bound by its kernels
//!   ([`Fitted::kernel_mfu`]): a slower step waits on its host, and that wait hides
//!   nothing (the reference's batch-1 runs at 5% MFU expose nearly all their
//!   communication). The last bucket and the latencies are never hidden.
//! - **Efficiency** = compute ÷ (compute + exposed communication): per-device
//!   throughput against one device alone.
//!
//! Left out: stragglers and jitter between ranks, the network's contention
//! with other jobs, NCCL's tree algorithms and in-network reduction (SHARP),
//! hierarchical rings that use NVLink within each node, the data loader, and
//! a per-rank batch so small that the host bounds the step (set
//! `expected_mfu_pct` to what one node measured). Its two constants
//! ([`FITTED`]) were fitted to the reference study's eight PyTorch DDP logs
//! (4-16 GH200s), which it then matches within 5 points; fitted on all but
//! one log, it forecasts the one left out within the bound
//! `tests/it/planning.rs` checks (docs/data-parallelism.md shows each).

use super::{DeviceKind, PlanHints, Precision, TrainConfig};
use crate::config::model::ModelConfig;
use serde::Serialize;

/// The bucket size the forecast counts: PyTorch DDP's, whose logs it was
/// calibrated on. The built-in trainer's buckets hold at most this much but
/// close at a block's end once they hold 1 MiB, and the token embedding's
/// gradient travels by rows (`train::dist::buckets`): more, smaller calls
/// than the forecast counts.
pub const BUCKET_BYTES: usize = 25 << 20;
/// The forecast's two fitted constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fitted {
    /// The MFU (in sweep's FLOP count) of a step's device work when its
    /// kernels bound it: how fast the backward window over which
    /// communication hides passes at the most.
    pub kernel_mfu: f64,
    /// The latency of one ring hop of one bucket (a few microseconds is what
    /// NCCL's tests show on such networks).
    pub hop_latency_s: f64,
}

/// Fitted to the reference study's eight PyTorch DDP logs (the bandwidths
/// are the device table's): these logs are the forecast's calibration data,
/// and the docs show how it forecasts each of them when fitted on the others.
pub const FITTED: Fitted = Fitted {
    kernel_mfu: 0.38,
    hop_latency_s: 6e-6,
};
/// `expected_mfu_pct` when the manifest does not say.
pub const DEFAULT_EXPECTED_MFU_PCT: f64 = 40.0;
/// The backward pass's share of a step's FLOPs.
const BACKWARD_SHARE: f64 = 2.0 / 3.0;

/// One run's forecast, per optimizer step and device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Forecast {
    /// The whole all-reduce of the gradients, hidden or not.
    pub allreduce_s: f64,
    /// The forward and backward passes at the expected MFU.
    pub compute_s: f64,
    /// The part of the all-reduce the step waits for.
    pub exposed_s: f64,
    /// Per-device throughput against one device alone, in percent.
    pub efficiency_pct: f64,
}

/// The shape of a data-parallel job and what its trainer does.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub world_size: usize,
    /// Ranks on one node (`ntasks_per_node`).
    pub ranks_per_node: usize,
    /// Whether gradient buckets are summed during the backward pass.
    pub overlaps: bool,
}

/// What the forecast needs to know of the devices and links.
#[derive(Debug, Clone, Copy)]
pub struct Hardware {
    pub peak_flops: f64,
    pub intra_node_gbps: f64,
    pub inter_node_gbps: f64,
}

impl Hardware {
    /// The run's GPU from the device table, with the configuration's peak
    /// and the plan's bandwidth hints over it; none for a CPU run or a GPU
    /// the table lacks (unless they give every figure).
    pub fn of(cfg: &TrainConfig, hints: &PlanHints) -> Option<Hardware> {
        let row = match cfg.device {
            DeviceKind::Cuda => cfg.gpu.as_deref().and_then(super::devices::lookup),
            DeviceKind::Cpu => None,
        };
        Some(Hardware {
            peak_flops: cfg.peak_flops.or(row.map(|r| r.peak_flops))?,
            intra_node_gbps: hints.intra_node_gbps.or(row.map(|r| r.intra_node_gbps))?,
            inter_node_gbps: hints.inter_node_gbps.or(row.map(|r| r.inter_node_gbps))?,
        })
    }
}

impl Fitted {
    /// The forecast of `cfg` (a fixed batch) on `job` at the hints' expected
    /// MFU with these constants ([`FITTED`]: the ones sweep uses); none for
    /// a single rank.
    pub fn forecast(
        self,
        cfg: &TrainConfig,
        hints: &PlanHints,
        model: &ModelConfig,
        hw: Hardware,
        job: Job,
    ) -> Option<Forecast> {
        let w = job.world_size;
        if w < 2 {
            return None;
        }
        let batch = cfg.batch_size.fixed()?;
        let tokens = (batch * cfg.sequence_length * cfg.gradient_accumulation) as f64;
        let flops = tokens * model.flops_per_token(cfg.sequence_length);
        let mfu = hints.expected_mfu_pct.unwrap_or(DEFAULT_EXPECTED_MFU_PCT) / 100.0;
        let compute_s = flops / (hw.peak_flops * mfu);
        // Gradients are summed in the parameters' type on GPUs (bf16 for bf16
        // runs), in f32 otherwise.
        let grad_bytes = match (cfg.device, cfg.precision) {
            (DeviceKind::Cuda, Precision::Bf16) => 2.0,
            _ => 4.0,
        } * model.total_params() as f64;
        let gbps = if w <= job.ranks_per_node {
            hw.intra_node_gbps
        } else {
            hw.inter_node_gbps
        };
        let ring = 2.0 * (w - 1) as f64 / w as f64;
        let bandwidth_s = ring * grad_bytes / (gbps * 1e9);
        let buckets = (grad_bytes / BUCKET_BYTES as f64).ceil();
        let latency_s = 2.0 * (w - 1) as f64 * buckets * self.hop_latency_s;
        let exposed_bandwidth_s = if job.overlaps {
            let window = BACKWARD_SHARE * flops / (hw.peak_flops * mfu.max(self.kernel_mfu));
            let last_bucket = ring * (BUCKET_BYTES as f64).min(grad_bytes) / (gbps * 1e9);
            (bandwidth_s - window).max(0.0) + last_bucket.min(bandwidth_s)
        } else {
            bandwidth_s
        };
        let exposed_s = exposed_bandwidth_s + latency_s;
        Some(Forecast {
            allreduce_s: bandwidth_s + latency_s,
            compute_s,
            exposed_s,
            efficiency_pct: 100.0 * compute_s / (compute_s + exposed_s),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(batch: usize) -> TrainConfig {
        TrainConfig {
            model: "ref-1b".into(),
            device: DeviceKind::Cuda,
            precision: Precision::Bf16,
            gpu: Some("GH200".into()),
            batch_size: super::super::BatchSize::Fixed(batch),
            ..TrainConfig::default()
        }
    }

    fn at(cfg: &TrainConfig, world_size: usize, overlaps: bool) -> Forecast {
        at_with(cfg, &PlanHints::default(), world_size, overlaps)
    }

    fn at_with(
        cfg: &TrainConfig,
        hints: &PlanHints,
        world_size: usize,
        overlaps: bool,
    ) -> Forecast {
        let model = ModelConfig::preset("ref-1b").unwrap();
        let job = Job {
            world_size,
            ranks_per_node: 4,
            overlaps,
        };
        FITTED
            .forecast(cfg, hints, &model, Hardware::of(cfg, hints).unwrap(), job)
            .unwrap()
    }

    #[test]
    fn communication_weighs_less_with_larger_batches_overlap_and_one_node() {
        let (b1, b8) = (cfg(1), cfg(8));
        for w in [2, 4, 8, 16] {
            let (one, eight) = (at(&b1, w, true), at(&b8, w, true));
            assert!(
                eight.efficiency_pct > one.efficiency_pct,
                "{w}: {one:?} {eight:?}"
            );
            assert!(at(&b8, w, false).efficiency_pct < eight.efficiency_pct);
            assert!(eight.exposed_s <= eight.allreduce_s);
            assert!((eight.compute_s / one.compute_s - 8.0).abs() < 1e-9);
        }
        // Leaving the node (NVLink -> network) costs more than growing within it.
        assert!(at(&b8, 8, false).allreduce_s > 3.0 * at(&b8, 4, false).allreduce_s);
        // A faster network helps.
        let fast = PlanHints {
            inter_node_gbps: Some(100.0),
            ..PlanHints::default()
        };
        assert!(at_with(&b1, &fast, 16, true).efficiency_pct > at(&b1, 16, true).efficiency_pct);
        // One rank has nothing to forecast; a CPU run has no table row.
        let model = ModelConfig::preset("ref-1b").unwrap();
        let none = PlanHints::default();
        let hw = Hardware::of(&b1, &none).unwrap();
        let single = Job {
            world_size: 1,
            ranks_per_node: 1,
            overlaps: true,
        };
        assert!(FITTED.forecast(&b1, &none, &model, hw, single).is_none());
        assert!(Hardware::of(&TrainConfig::default(), &none).is_none());
    }

    #[test]
    fn the_figures_follow_from_the_formula() {
        // ref-1b in bf16 over 16 GH200s (4 nodes): 2·15/16 of its gradient
        // bytes at 25 GB/s, plus 2·15 hops of 6 µs per 25 MiB bucket.
        let model = ModelConfig::preset("ref-1b").unwrap();
        let bytes = 2.0 * model.total_params() as f64;
        let f = at(&cfg(1), 16, false);
        let want =
            2.0 * 15.0 / 16.0 * bytes / 25e9 + 30.0 * (bytes / (25u64 << 20) as f64).ceil() * 6e-6;
        assert!((f.allreduce_s - want).abs() < 1e-12, "{f:?}");
        let compute = 2048.0 * model.flops_per_token(2048) / (989e12 * 0.4);
        assert!((f.compute_s - compute).abs() < 1e-12);
        assert_eq!(f.exposed_s, f.allreduce_s, "nothing hidden without overlap");
        assert!((f.efficiency_pct - 100.0 * compute / (compute + want)).abs() < 1e-9);
    }
}
