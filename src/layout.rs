//! The files and directories sweep owns, by name, in one place: what planning writes into run
//! and stage directories, the study's own, the history. No command's output may replace them.

/// The built-in trainer's configuration (runs of the built-in trainer).
pub const CONFIG_TOML: &str = "config.toml";
/// The job script, for `sbatch` or the local executor.
pub const JOB_SBATCH: &str = "job.sbatch";
/// A run's record: who it is and every job submitted for it.
pub const RUN_JSON: &str = "run.json";
/// A stage's record, as `run.json` is a run's.
pub const STAGE_JSON: &str = "stage.json";

/// What a study directory records of the manifest that last rendered it.
pub const STUDY_JSON: &str = "study.json";
/// Grouped reports beside the main one (`results/<study>/grouped/<keys>`).
pub const GROUPED_DIR: &str = "grouped";

/// Everything rendering writes: what a directory holds besides outputs.
pub const RENDERED: [&str; 4] = [CONFIG_TOML, JOB_SBATCH, RUN_JSON, STAGE_JSON];

/// What a job writes: the trainer's metrics, its checkpoints, the shell's exit status.
pub const METRICS_JSONL: &str = "metrics.jsonl";
pub const CHECKPOINTS_DIR: &str = "checkpoints";
pub const EXIT_CODE: &str = "exit_code";

/// The watchdog's: each rank's progress (and stacks when asked) and the evidence it gathered
/// (docs/running.md, "When a run hangs").
pub const PROGRESS_DIR: &str = "progress";
pub const WATCHDOG_LOG: &str = "watchdog.log";

/// Whether a run directory's file is a job log: every `*.out` (SLURM's, or `local.out`).
pub fn is_job_log(path: &std::path::Path) -> bool {
    path.extension().is_some_and(|x| x == "out")
}

/// What the job found of its machine (`sweep fingerprint`).
pub const ENVIRONMENT_JSON: &str = "environment.json";

/// Earlier attempts of a study (`sweep run --again`): `attempts/<attempt>/<run>`.
pub const ATTEMPTS_DIR: &str = "attempts";

/// The study's stage directories (`results/<study>/stages/<stage>`).
pub const STAGES_DIR: &str = "stages";
/// SLURM's array logs and the array scripts (`results/<study>/logs`).
pub const LOGS_DIR: &str = "logs";
/// The job arrays' scripts `sweep submit` writes (`results/<study>/arrays`).
pub const ARRAYS_DIR: &str = "arrays";
/// The packed blocks' scripts `sweep submit` writes (`results/<study>/blocks`).
pub const BLOCKS_DIR: &str = "blocks";
/// Run directories the manifest changed, moved aside (`--replace-changed`).
pub const REPLACED_DIR: &str = "replaced";
/// The study's own directories beside its runs': no run may take their names.
pub const STUDY_DIRS: [&str; 7] = [
    STAGES_DIR,
    LOGS_DIR,
    ARRAYS_DIR,
    BLOCKS_DIR,
    REPLACED_DIR,
    GROUPED_DIR,
    ATTEMPTS_DIR,
];

/// Whether a run may take this name: none of the study's own directories or files.
pub fn reserved(name: &str) -> bool {
    STUDY_DIRS.contains(&name) || name == STUDY_JSON
}

/// The performance history, in a project's `results/`.
pub const HISTORY_SQLITE: &str = "history.sqlite";
/// SQLite's application id of a sweep history ("swep"): a file without it is not sweep's.
pub const HISTORY_APPLICATION_ID: i32 = 0x7377_6570;

/// Where the repository's own files are: `root` when it holds `probe`, else the checkout this
/// binary was built in, else `root` (the caller's error then names the missing file).
pub fn repository(root: &std::path::Path, probe: &str) -> std::path::PathBuf {
    let beside_build = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()));
    [Some(root.to_path_buf()), beside_build]
        .into_iter()
        .flatten()
        .find(|d| d.join(probe).is_file())
        .unwrap_or_else(|| root.to_path_buf())
}
