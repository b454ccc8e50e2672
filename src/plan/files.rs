//! The files planning writes into every run (and stage) directory, by name,
//! in one place: rendering writes them, records and executors find them.

/// The built-in trainer's configuration (runs of the built-in trainer).
pub const CONFIG_TOML: &str = "config.toml";
/// The job script, for `sbatch` or the local executor.
pub const JOB_SBATCH: &str = "job.sbatch";
/// A run's record: who it is and every job submitted for it.
pub const RUN_JSON: &str = "run.json";
/// A stage's record, as `run.json` is a run's.
pub const STAGE_JSON: &str = "stage.json";

/// Everything rendering writes: what a directory holds besides outputs.
pub const RENDERED: [&str; 4] = [CONFIG_TOML, JOB_SBATCH, RUN_JSON, STAGE_JSON];
