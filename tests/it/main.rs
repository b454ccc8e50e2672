//! Integration tests: one binary (each test binary links every dependency).
//! Tests marked `#[ignore]` need the local SLURM cluster or the full corpus;
//! `scripts/test.sh` starts the cluster and runs them all, but for `gpu::`,
//! which needs a GPU and a GPU build (docs/gpu.md).

mod data;
#[cfg(feature = "mpi")]
mod ddp;
mod e2e;
mod faults;
mod foreign;
mod gpu;
mod guards;
mod hang;
mod history;
mod launch;
mod local;
mod manifests;
#[cfg(feature = "mpi")]
mod nodes;
mod page;
mod planning;
mod report;
mod repository;
mod slurm;
mod support;
mod train;
#[cfg(feature = "mpi")]
mod zero;
