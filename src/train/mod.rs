//! The built-in trainer: a LLaMA-style model in candle, trained on a run's
//! data. Where each job lives:
//!
//! - [`run`]: `sweep train`, the process — threads, signals, resuming, the
//!   step loop, exit codes;
//! - [`trainer`]: one rank's model, data and optimizer, and one optimizer step;
//! - [`model`], [`blockwise`], [`params`]: the model, its forward and
//!   backward block by block, its parameters;
//! - [`ops`]: each op's kernels (CPU and CUDA) and composed twin;
//! - [`grads`], [`optim`], [`schedule`], [`monitor`]: gradient buffers,
//!   AdamW and the learning rate, what happens at which step, loss spikes
//!   and plateaus;
//! - [`metrics`], [`record`]: what a logged step measures, and `metrics.jsonl`;
//! - [`checkpoint`], [`max_batch`], [`dist`], [`device`], [`peak`];
//! - [`parts`]: where a step's time goes, op by op (`sweep bench train --parts`).

pub mod blockwise;
mod checkpoint;
pub mod device;
pub mod dist;
pub mod grads;
pub mod kernels;
pub mod max_batch;
pub mod metrics;
pub mod model;
mod monitor;
pub mod ops;
pub mod optim;
#[cfg(test)]
mod oracle;
pub mod params;
pub mod parts;
pub mod peak;
pub mod record;
mod run;
mod schedule;
mod stacks;
mod trainer;

pub use run::{init_threads, run};
pub use trainer::{StepOutcome, Trainer};
