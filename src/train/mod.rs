//! The built-in trainer: a LLaMA-style model in candle, trained on a run's
//! data, in two parts — data flows from the run to the network, never back:
//!
//! - [`network`]: the model and what computes it — its structure and
//!   parameters, the forward and backward block by block, gradient buffers,
//!   AdamW, each op's kernels (CPU and CUDA) with its composed twin, the
//!   device and its kernels' self-check, and where a step's time goes;
//! - [`run`](mod@run): `sweep train`, the process — threads, signals, resuming, the
//!   step loop and exit codes — with one rank's trainer, the schedule, the
//!   monitor, metrics and `metrics.jsonl`, checkpoints, the largest batch,
//!   data parallelism and the stacks the watchdog gathers.

pub mod network;
pub mod run;

pub use run::{init_threads, run, Trainer};
