//! The built-in trainer: a LLaMA-style model in candle, trained on a run's
//! data. Where each job lives:
//!
//! - [`run`]: `sweep train`, the process — threads, signals, resuming, the
//!   step loop, exit codes;
//! - [`trainer`]: one rank's model, data and optimizer, and one optimizer step;
//! - [`model`], [`attention`], [`ops`], [`params`]: the model and its kernels;
//! - [`optim`], [`schedule`], [`monitor`]: AdamW and the learning rate, what
//!   happens at which step, loss spikes and plateaus;
//! - [`metrics`], [`record`]: what a logged step measures, and `metrics.jsonl`;
//! - [`checkpoint`], [`max_batch`], [`dist`], [`device`], [`peak`].

pub mod attention;
pub mod blockwise;
mod checkpoint;
pub mod device;
pub mod dist;
pub mod max_batch;
pub mod metrics;
pub mod model;
mod monitor;
pub mod ops;
pub mod optim;
#[cfg(feature = "cuda")]
mod optim_cuda;
#[cfg(test)]
mod oracle;
pub mod params;
pub mod peak;
pub mod record;
mod run;
mod schedule;
mod trainer;

pub use run::{init_threads, run};
pub use trainer::{StepOutcome, Trainer};
