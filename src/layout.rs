//! The files and directories sweep owns, by name, in one place: those
//! planning writes into every run (and stage) directory, the study's own
//! directories, and the history. Rendering writes them, records and
//! executors find them, and no output of any command may replace them.

/// The built-in trainer's configuration (runs of the built-in trainer).
pub const CONFIG_TOML: &str = "config.toml";
/// The job script, for `sbatch` or the local executor.
pub const JOB_SBATCH: &str = "job.sbatch";
/// A run's record: who it is and every job submitted for it.
pub const RUN_JSON: &str = "run.json";
/// A stage's record, as `run.json` is a run's.
pub const STAGE_JSON: &str = "stage.json";

/// What the study directory records of the manifest that last rendered it
/// (`results/<study>/study.json`): which file and version, its report
/// settings and its runs.
pub const STUDY_JSON: &str = "study.json";
/// Grouped reports (`sweep report --group-by`) beside the main one
/// (`results/<study>/grouped/<keys>`).
pub const GROUPED_DIR: &str = "grouped";

/// Everything rendering writes: what a directory holds besides outputs.
pub const RENDERED: [&str; 4] = [CONFIG_TOML, JOB_SBATCH, RUN_JSON, STAGE_JSON];

/// What a job writes as it runs and ends: the built-in trainer's metrics
/// (one JSON record per logged step), its checkpoints, and the job shell's
/// exit status (`<job id> <$?>`, by both executors).
pub const METRICS_JSONL: &str = "metrics.jsonl";
pub const CHECKPOINTS_DIR: &str = "checkpoints";
pub const EXIT_CODE: &str = "exit_code";

/// What a run's watchdog reads and writes (docs/running.md, "When a run
/// hangs"): each rank's progress (`progress/rank-<r>`, and its stacks when
/// asked, `progress/rank-<r>.stacks`) and the evidence it gathered before
/// it stopped the run (why is in the job's record in `run.json`).
pub const PROGRESS_DIR: &str = "progress";
pub const WATCHDOG_LOG: &str = "watchdog.log";

/// Whether a file of a run directory is one of its jobs' logs: every
/// `*.out` — a SLURM job's `<job name>-<job id>.out` (its `--output`, or an
/// array task's or a packed run's own), the local executor's `local.out`.
pub fn is_job_log(path: &std::path::Path) -> bool {
    path.extension().is_some_and(|x| x == "out")
}

/// What the job found of the machine it ran on, written by the job itself
/// (`sweep fingerprint`).
pub const ENVIRONMENT_JSON: &str = "environment.json";

/// Earlier attempts of a study measured again (`sweep run --again`):
/// `results/<study>/attempts/<attempt>/<run>`.
pub const ATTEMPTS_DIR: &str = "attempts";

/// The study's stage directories (`results/<study>/stages/<stage>`).
pub const STAGES_DIR: &str = "stages";
/// SLURM's array logs and the array scripts (`results/<study>/logs`).
pub const LOGS_DIR: &str = "logs";
/// The job arrays' scripts `sweep submit` writes (`results/<study>/arrays`).
pub const ARRAYS_DIR: &str = "arrays";
/// The packed blocks' scripts `sweep submit` writes (`results/<study>/blocks`).
pub const BLOCKS_DIR: &str = "blocks";
/// Directories of runs the manifest changed, moved aside by
/// `--replace-changed` (`results/<study>/replaced/<time>`).
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

/// Whether a run may take this name: not one of the study's own
/// directories or files.
pub fn reserved(name: &str) -> bool {
    STUDY_DIRS.contains(&name) || name == STUDY_JSON
}

/// The performance history, in a project's `results/`.
pub const HISTORY_SQLITE: &str = "history.sqlite";
/// SQLite's application id of a sweep history (the bytes "swep"), set when
/// sweep creates the file: a file without it is not sweep's to write.
pub const HISTORY_APPLICATION_ID: i32 = 0x7377_6570;

/// Where the repository's own files are (its scripts, the bundled tokenizer
/// and data): the project root when it holds `probe`, else the checkout this
/// binary was built in (`target/release/sweep` → the checkout), else the
/// project root (whose missing file the caller's error then names).
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
