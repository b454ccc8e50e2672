//! `sweep`: LLM-training throughput studies from one TOML manifest.
//!
//! The modules follow the pipeline, and data flows one way through it (no
//! module imports one above it): `manifest` (parse, validate) -> `plan`
//! (expand into runs, render run directories) -> `executor` (SLURM or local
//! jobs) -> `data` + `train` (what a job runs) -> `report` (tables, charts,
//! pages, one judge of a study against another or its history).
//! `estimate` holds the device peaks, FLOPs and MFU, the memory estimate and
//! the scaling forecast; `config` the run configuration they share;
//! `layout` the names of every file sweep owns; `template` the minijinja
//! engine of manifests, job scripts and pages; `util` what every stage uses.
//! `study` holds a study's verbs (plan, render, submit, run and watch,
//! status, cancel); `cli` parses the command line once, calls them and prints
//! what they return; `bench` measures the trainer (`bench/`, the
//! `sweep-bench` binary, sweep's own tooling).

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
pub mod study;
pub mod template;
pub mod train;
pub mod util;
