//! `sweep`: LLM-training throughput studies from one TOML manifest.
//!
//! The modules follow the pipeline, and data flows one way through it:
//! `manifest` (parse, validate) -> `plan` (expand into runs, render run
//! directories) -> `executor` (SLURM or local jobs) -> `data` + `train` (what a
//! job runs) -> `report` (tables and plots). `config` is the run configuration
//! they share; `cli` parses the command line once and hands over; `bench`
//! measures the hot paths.

pub mod bench;
pub mod cli;
pub mod config;
pub mod data;
pub mod estimate;
pub mod executor;
pub mod layout;
pub mod manifest;
pub mod plan;
pub mod report;
pub mod template;
pub mod train;
pub mod util;
