//! The network: what a training step computes, and with what.
//!
//! - [`model`], [`params`]: the model's structure and its parameters;
//! - [`blockwise`]: its forward and backward, block by block (the only
//!   passes; `oracle`, tests only, checks them against candle's autograd);
//! - [`grads`], [`optim`]: gradient buffers, AdamW and the learning rate;
//! - [`ops`]: each op's forward and backward, CPU kernel, CUDA launch and
//!   composed twin; [`kernels`]: the CUDA sources and their table;
//! - [`device`]: opening the device, its name and memory, its kernels'
//!   self-check; [`parts`]: where a step's time goes, op by op (`sweep bench
//!   train --parts`).

pub mod blockwise;
pub mod device;
pub mod grads;
pub mod kernels;
pub mod model;
pub mod ops;
pub mod optim;
#[cfg(test)]
pub(crate) mod oracle;
pub mod params;
pub mod parts;
