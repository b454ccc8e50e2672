//! The scaling forecast of a data-parallel run, before anything is queued: compute is the
//! step's FLOPs at the expected MFU; the all-reduce a ring over the slowest link with a hop's
//! latency per call; the backward hides what it can (never the last bucket, the embedding's
//! rows or latencies). The constants ([`FITTED`]) fit the reference's PyTorch DDP logs:
//! docs/data-parallelism.md gives the model, what it leaves out, and its errors.

use crate::config::model::ModelConfig;
use crate::config::{DeviceKind, PlanHints, Precision, TrainConfig};
use serde::Serialize;

/// The largest bucket: PyTorch DDP's (the calibration's) and the built-in trainer's.
pub const BUCKET_BYTES: usize = 25 << 20;
/// The trainer closes a bucket at a block's end once it holds this much.
pub const MIN_BUCKET_BYTES: usize = 1 << 20;
/// The forecast's two fitted constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fitted {
    /// The MFU of a step's device work when kernels bound it: how fast the backward window passes.
    pub kernel_mfu: f64,
    /// The latency of one ring hop of one bucket (with each bucket's launch and synchronisation).
    pub hop_latency_s: f64,
}

/// Fitted to the reference study's eight PyTorch DDP logs (docs/data-parallelism.md).
pub const FITTED: Fitted = Fitted {
    kernel_mfu: 0.21,
    hop_latency_s: 16e-6,
};
/// `expected_mfu_pct` when the manifest does not say.
pub const DEFAULT_EXPECTED_MFU_PCT: f64 = 40.0;
/// The backward pass's share of a step's FLOPs.
const BACKWARD_SHARE: f64 = 2.0 / 3.0;

/// One run's forecast, per optimizer step and device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Forecast {
    /// The whole all-reduce (under ZeRO, reduce-scatter and all-gather), hidden or not.
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
pub struct ParallelJob {
    pub world_size: usize,
    /// Ranks on one node (`ntasks_per_node`).
    pub ranks_per_node: usize,
    /// Whether gradient buckets are summed during the backward pass.
    pub overlaps: bool,
    /// Which bytes travel, in which buckets.
    pub traffic: Traffic,
}

/// How a trainer's gradients travel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Traffic {
    /// Every gradient in buckets of [`BUCKET_BYTES`] (PyTorch DDP, as the constants were fitted).
    Dense,
    /// sweep's trainer: buckets closing at a block's end, then the embedding's used rows.
    Builtin,
}

/// The bytes of one step's sums and how they are cut.
struct Volume {
    /// Summed in buckets, in the order the backward pass finishes them.
    bucketed: f64,
    /// The last of those buckets.
    last_bucket: f64,
    /// Summed after the backward pass (the embedding's marks and rows).
    after: f64,
    /// All-reduce calls.
    calls: f64,
    /// When the backward has finished each part of `bucketed`: (work done by then, bytes);
    /// `None`: evenly (PyTorch's buckets).
    ready: Option<Vec<(f64, f64)>>,
}

impl Traffic {
    fn volume(
        self,
        model: &ModelConfig,
        element: f64,
        tokens_all_ranks: f64,
        seq: usize,
    ) -> Volume {
        let bucket = BUCKET_BYTES as f64;
        match self {
            Traffic::Dense => {
                let all = element * model.total_params() as f64;
                Volume {
                    bucketed: all,
                    last_bucket: bucket.min(all),
                    after: 0.0,
                    calls: (all / bucket).ceil(),
                    ready: None,
                }
            }
            Traffic::Builtin => {
                let (vocab, dim) = (model.vocab_size as f64, model.dim as f64);
                // A resolved model has at least one layer.
                let layers = model.n_layers as f64;
                let bucketed = element * model.non_embedding_params() as f64;
                let block = element * model.block_params() as f64;
                // The output head and the final norm.
                let head = bucketed - layers * block;
                let min = MIN_BUCKET_BYTES as f64;
                let block_calls = if block >= min {
                    layers * (block / bucket).ceil()
                } else {
                    (layers * block / min).ceil()
                };
                // The backward goes from the head down the blocks; each part's work as in flops_per_token.
                let per_token = model.flops_per_token(seq);
                let head_share = 6.0 * dim * vocab / per_token;
                let block_share = (1.0 - head_share) / layers;
                let ready = std::iter::once((head_share, head))
                    .chain(
                        (1..=model.n_layers).map(|k| (head_share + k as f64 * block_share, block)),
                    )
                    .collect();
                Volume {
                    bucketed,
                    last_bucket: block.max(min).min(bucket).min(bucketed),
                    after: 4.0 * vocab + element * dim * tokens_all_ranks.min(vocab),
                    calls: (head / bucket).ceil() + block_calls + 2.0,
                    ready: Some(ready),
                }
            }
        }
    }
}

/// What the forecast needs to know of the devices and links.
#[derive(Debug, Clone, Copy)]
pub struct Hardware {
    pub peak_flops: f64,
    /// Only the link a job sums over must be known.
    pub intra_node_gbps: Option<f64>,
    pub inter_node_gbps: Option<f64>,
}

impl Hardware {
    /// The run's GPU from the device table with the configuration's peak and the hints' bandwidths;
    /// none for a CPU or an unknown GPU (unless the hints give every figure).
    pub fn of(cfg: &TrainConfig, hints: &PlanHints) -> Option<Hardware> {
        let row = match cfg.device {
            DeviceKind::Cuda => cfg.gpu.as_deref().and_then(super::devices::lookup),
            DeviceKind::Cpu => None,
        };
        Some(Hardware {
            peak_flops: cfg.peak_flops.or(row.map(|r| r.peak_flops))?,
            intra_node_gbps: hints.intra_node_gbps.or(row.map(|r| r.intra_node_gbps)),
            inter_node_gbps: hints.inter_node_gbps.or(row.map(|r| r.inter_node_gbps)),
        })
    }
}

impl Fitted {
    /// The forecast of `cfg` on `job` at the hints' expected MFU with these constants; none for
    /// one rank.
    pub fn forecast(
        self,
        cfg: &TrainConfig,
        hints: &PlanHints,
        model: &ModelConfig,
        hw: Hardware,
        job: ParallelJob,
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
        // Gradients are summed in the parameters' type on GPUs, in f32 otherwise.
        let element = match (cfg.device, cfg.precision) {
            (DeviceKind::Cuda, Precision::Bf16) => 2.0,
            _ => 4.0,
        };
        let v = job
            .traffic
            .volume(model, element, tokens * w as f64, cfg.sequence_length);
        let gbps = if w <= job.ranks_per_node {
            hw.intra_node_gbps
        } else {
            hw.inter_node_gbps
        }?;
        // A ring all-reduce is a reduce-scatter and an all-gather, (w − 1)/w of the bytes each;
        // ZeRO's gather comes after the optimizer, where nothing hides it.
        let half = (w - 1) as f64 / w as f64;
        let ring = if cfg.zero > 0 { half } else { 2.0 * half };
        let seconds = |bytes: f64| ring * bytes / (gbps * 1e9);
        let gather_s = match cfg.zero {
            0 => 0.0,
            _ => half * element * model.total_params() as f64 / (gbps * 1e9),
        };
        let (bucketed_s, after_s) = (seconds(v.bucketed), seconds(v.after));
        let calls = v.calls * if cfg.zero > 0 { 2.0 } else { 1.0 };
        let latency_s = 2.0 * (w - 1) as f64 * calls * self.hop_latency_s;
        let exposed_bucketed_s = if job.overlaps {
            let window = BACKWARD_SHARE * flops / (hw.peak_flops * mfu.max(self.kernel_mfu));
            // Each part is sent once ready and the parts before it are sent; the rest is exposed.
            let unhidden = match &v.ready {
                Some(parts) => {
                    let sent = parts.iter().fold(0.0f64, |link_free, &(done, bytes)| {
                        link_free.max(done * window) + seconds(bytes)
                    });
                    sent - window
                }
                None => bucketed_s - window,
            };
            unhidden.max(seconds(v.last_bucket)).min(bucketed_s)
        } else {
            bucketed_s
        };
        let exposed_s = exposed_bucketed_s + after_s + latency_s + gather_s;
        Some(Forecast {
            allreduce_s: bucketed_s + after_s + latency_s + gather_s,
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
            batch_size: crate::config::BatchSize::Fixed(batch),
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
        let job = ParallelJob {
            world_size,
            ranks_per_node: 4,
            overlaps,
            traffic: Traffic::Dense,
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
        let single = ParallelJob {
            world_size: 1,
            ranks_per_node: 1,
            overlaps: true,
            traffic: Traffic::Builtin,
        };
        assert!(FITTED.forecast(&b1, &none, &model, hw, single).is_none());
        assert!(Hardware::of(&TrainConfig::default(), &none).is_none());
    }

    #[test]
    fn the_figures_follow_from_the_formula() {
        // ref-1b in bf16 over 16 GH200s (4 nodes): 2·15/16 of its gradient
        // bytes at 25 GB/s, plus 2·15 hops of 16 µs per 25 MiB bucket.
        let model = ModelConfig::preset("ref-1b").unwrap();
        let bytes = 2.0 * model.total_params() as f64;
        let f = at(&cfg(1), 16, false);
        let want =
            2.0 * 15.0 / 16.0 * bytes / 25e9 + 30.0 * (bytes / (25u64 << 20) as f64).ceil() * 16e-6;
        assert!((f.allreduce_s - want).abs() < 1e-12, "{f:?}");
        let compute = 2048.0 * model.flops_per_token(2048) / (989e12 * 0.4);
        assert!((f.compute_s - compute).abs() < 1e-12);
        assert_eq!(f.exposed_s, f.allreduce_s, "nothing hidden without overlap");
        assert!((f.efficiency_pct - 100.0 * compute / (compute + want)).abs() < 1e-9);
    }

    /// ZeRO moves the buckets by half a ring (the reduce-scatter) and every
    /// parameter by the other half after the step (the all-gather, exposed).
    #[test]
    fn zero_scatters_the_gradients_and_gathers_every_parameter_after_the_step() {
        let model = ModelConfig::preset("ref-1b").unwrap();
        let plain = at(&cfg(1), 16, false);
        let sharded = at(&TrainConfig { zero: 1, ..cfg(1) }, 16, false);
        let bytes = 2.0 * model.total_params() as f64;
        let hops = 2.0 * 30.0 * (bytes / (25u64 << 20) as f64).ceil() * 16e-6;
        let want = 15.0 / 16.0 * bytes / 25e9 * 2.0 + hops;
        assert!((sharded.allreduce_s - want).abs() < 1e-12, "{sharded:?}");
        assert_eq!(sharded.exposed_s, sharded.allreduce_s);
        // The same bytes as the all-reduce; twice its calls.
        assert!((sharded.allreduce_s - plain.allreduce_s - hops / 2.0).abs() < 1e-12);
        // With overlap, the gather is left exposed: never less than plain's.
        let (plain, sharded) = (
            at(&cfg(8), 4, true),
            at(&TrainConfig { zero: 2, ..cfg(8) }, 4, true),
        );
        assert!(sharded.exposed_s > plain.exposed_s, "{plain:?} {sharded:?}");
        assert!(sharded.exposed_s >= 3.0 / 4.0 * bytes / (hw_gbps(&cfg(8), 4) * 1e9));
        assert!(plain.allreduce_s > 0.0);
    }

    /// The link a forecast of `cfg` on `w` ranks (4 a node) uses, in GB/s.
    fn hw_gbps(cfg: &TrainConfig, w: usize) -> f64 {
        let hw = Hardware::of(cfg, &PlanHints::default()).unwrap();
        if w <= 4 {
            hw.intra_node_gbps
        } else {
            hw.inter_node_gbps
        }
        .unwrap()
    }

    /// sweep's trainer: the embedding by the rows a step can use, after the
    /// backward pass; whatever the link, no more is exposed than is sent.
    #[test]
    fn sweeps_trainer_sends_the_embedding_by_rows_and_exposes_at_most_what_it_sends() {
        let mut model = ModelConfig::preset("tiny").unwrap();
        model.vocab_size = 32_000;
        let cfg = TrainConfig {
            model: "tiny".into(),
            batch_size: crate::config::BatchSize::Fixed(4),
            sequence_length: 256,
            peak_flops: Some(1e11),
            ..TrainConfig::default()
        };
        let hints = PlanHints {
            expected_mfu_pct: Some(30.0),
            ..PlanHints::default()
        };
        let at = |traffic, gbps: f64, w: usize| {
            let hw = Hardware {
                peak_flops: 1e11,
                intra_node_gbps: None,
                inter_node_gbps: Some(gbps),
            };
            let job = ParallelJob {
                world_size: w,
                ranks_per_node: 1,
                overlaps: true,
                traffic,
            };
            FITTED.forecast(&cfg, &hints, &model, hw, job).unwrap()
        };
        // Two ranks: a ring factor of 1; 2,048 tokens use at most 2,048 rows.
        let f = at(Traffic::Builtin, 0.0625, 2);
        let bytes =
            4.0 * model.non_embedding_params() as f64 + 4.0 * 32_000.0 + 4.0 * 128.0 * 2048.0;
        let latency = f.allreduce_s - bytes / 0.0625e9;
        assert!(latency > 0.0 && latency < 1e-3, "{f:?}");
        assert!(f.allreduce_s < at(Traffic::Dense, 0.0625, 2).allreduce_s);
        for traffic in [Traffic::Dense, Traffic::Builtin] {
            for gbps in [0.01, 0.0625, 0.625, 6.25, 1e3] {
                for w in [2, 3, 8] {
                    let f = at(traffic, gbps, w);
                    assert!(
                        f.exposed_s <= f.allreduce_s + 1e-15 && f.exposed_s > 0.0,
                        "{traffic:?} {gbps} {w}: {f:?}"
                    );
                }
            }
        }
    }
}
