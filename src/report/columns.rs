//! The summary's column names in one place: metric × statistic (`tokens_per_second_mean`) and
//! constants for the rest. Tables, exports and charts name columns only through these.

pub use super::ingest::Field;
use super::ingest::Point;

impl Field {
    /// The summary column of one statistic of this field.
    pub fn col(self, stat: Stat) -> String {
        format!("{}_{}", self.name(), stat.name())
    }
}

/// What the summary gives statistics of: a known metric, or a foreign log's field (`mem_gb`),
/// summarised the same way (`mem_gb_mean`, ...).
#[derive(Debug, Clone, PartialEq)]
pub enum Measure {
    Known(Field),
    /// `Point::extra[index]`.
    Extra {
        index: usize,
        name: String,
    },
}

impl Measure {
    /// The known metrics, then the extra fields `extras` (in their order).
    pub fn all(extras: &[String]) -> Vec<Measure> {
        Field::summarised()
            .map(Measure::Known)
            .chain(
                extras
                    .iter()
                    .enumerate()
                    .map(|(index, name)| Measure::Extra {
                        index,
                        name: name.clone(),
                    }),
            )
            .collect()
    }

    /// The column of the points frame.
    pub fn name(&self) -> &str {
        match self {
            Measure::Known(m) => m.name(),
            Measure::Extra { name, .. } => name,
        }
    }

    pub fn col(&self, stat: Stat) -> String {
        format!("{}_{}", self.name(), stat.name())
    }

    pub fn ci_low(&self) -> String {
        format!("{}_ci95_low", self.name())
    }

    pub fn ci_high(&self) -> String {
        format!("{}_ci95_high", self.name())
    }

    /// Whether its mean gets a 95% interval (every extra field does).
    pub fn has_interval(&self) -> bool {
        match self {
            Measure::Known(m) => WITH_INTERVALS.contains(m),
            Measure::Extra { .. } => true,
        }
    }

    /// Its value at a log point.
    pub fn of(&self, p: &Point) -> Option<f64> {
        match self {
            Measure::Known(m) => m.of(p),
            Measure::Extra { index, .. } => p.extra.get(*index).copied().flatten(),
        }
    }
}

/// The metrics whose means get confidence intervals.
pub const WITH_INTERVALS: [Field; 4] = [
    Field::TokensPerSecond,
    Field::MfuPct,
    Field::Tflops,
    Field::PeakMemoryMb,
];

/// A statistic over a run's steady-state points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "lowercase")]
pub enum Stat {
    Mean,
    Median,
    Std,
    P5,
    P95,
}

impl Stat {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

// Both frames.
pub const RUN: &str = "run";
// The points frame: one row per logged step.
pub const LOG_INDEX: &str = "log_index";
pub const STEP: &str = "step";
pub const LOSS: &str = Field::Loss.name();
pub const STEP_TIME_S: &str = Field::StepTimeS.name();
pub const ELAPSED_S: &str = Field::ElapsedS.name();
pub const GLOBAL_TOKENS_PER_SECOND: &str = Field::GlobalTokensPerSecond.name();
/// Ranks training together (1 when a log does not say).
pub const WORLD_SIZE: &str = Field::WorldSize.name();
/// Sequences per device and micro-batch as trained (what `"max"` became).
pub const TRAINED_BATCH_SIZE: &str = "trained_batch_size";
// The summary table: one row per run or group.
pub const ORDER: &str = "order";
pub const STATE: &str = "state";
pub const RUNS: &str = "runs";
pub const POINTS: &str = "points";
pub const FINAL_LOSS: &str = "final_loss";
pub const WALL_TIME_S: &str = "wall_time_s";
pub const LAST_STEP: &str = "last_step";
pub const SPEEDUP: &str = "speedup";
pub const SPEEDUP_CI95_LOW: &str = "speedup_ci95_low";
pub const SPEEDUP_CI95_HIGH: &str = "speedup_ci95_high";
/// The two-sided p-value of "the speedup is 1", comparison by comparison.
pub const SPEEDUP_P_VALUE: &str = "speedup_p_value";
/// The same, Holm-adjusted over the study's comparisons with its baseline.
pub const SPEEDUP_P_VALUE_HOLM: &str = "speedup_p_value_holm";
/// Whether the Holm-adjusted p-value is below 0.05 (null for the baseline).
pub const SIGNIFICANT: &str = "significant";
/// The runs of a configuration (its repeats).
pub const REPEATS: &str = "repeats";
/// Leading log points dropped as warm-up (after the fixed skip).
pub const WARMUP_POINTS: &str = "warmup_points";
/// Per-device tokens/s here ÷ at the configuration's smallest world size, in percent.
pub const SCALING_EFFICIENCY_PCT: &str = "scaling_efficiency_pct";
/// The same ratio as `sweep plan`'s forecast has it, beside the measured one.
pub const FORECAST_EFFICIENCY_PCT: &str = "forecast_efficiency_pct";
/// The peak per device (TFLOP/s) a row's MFU is measured against (TFLOPs ÷ MFU).
pub const MFU_PEAK_TFLOPS: &str = "mfu_peak_tflops";
/// Helper: a run's job time by its executor's clock (wall time without `elapsed_s`).
pub const JOB_RUN_S: &str = "_job_run_s";
/// Helper: the forecast's efficiency against one device alone.
pub const FORECAST_VS_ONE_DEVICE: &str = "_forecast_vs_one_device";
/// The parameters setting the world size (and its time limit): a configuration across scales.
pub const SCALE_PARAMS: [&str; 8] = [
    WORLD_SIZE,
    "nodes",
    "gpus",
    "slurm.nodes",
    "slurm.ntasks_per_node",
    "slurm.gpus_per_node",
    "global_batch_size",
    "slurm.time",
];
// Only while summarising.
pub const MEMBERS: &str = "members";
pub const FIRST_STEADY: &str = "first_steady";
/// A run's configuration: what its repeats share (the planner's id).
pub const CONFIGURATION: &str = "configuration";
/// The configuration's name, which names the row of its repeats.
pub const CONFIGURATION_NAME: &str = "configuration_name";

#[cfg(test)]
mod tests {
    use super::*;
    use strum::VariantArray;

    /// Every column the report makes of its own is one the manifest keeps
    /// foreign groups from making (`manifest::REPORT_COLUMNS`), and every
    /// statistic's suffix is one it knows.
    #[test]
    fn the_manifest_knows_every_column_of_the_report() {
        use crate::manifest::{is_known_group, REPORT_COLUMNS, STAT_SUFFIXES};
        for c in [
            RUN,
            LOG_INDEX,
            STEP,
            LOSS,
            STEP_TIME_S,
            ELAPSED_S,
            GLOBAL_TOKENS_PER_SECOND,
            WORLD_SIZE,
            TRAINED_BATCH_SIZE,
            ORDER,
            STATE,
            RUNS,
            POINTS,
            FINAL_LOSS,
            WALL_TIME_S,
            LAST_STEP,
            SPEEDUP,
            SPEEDUP_CI95_LOW,
            SPEEDUP_CI95_HIGH,
            SPEEDUP_P_VALUE,
            SPEEDUP_P_VALUE_HOLM,
            SIGNIFICANT,
            REPEATS,
            WARMUP_POINTS,
            SCALING_EFFICIENCY_PCT,
            FORECAST_EFFICIENCY_PCT,
            MFU_PEAK_TFLOPS,
            JOB_RUN_S,
            FORECAST_VS_ONE_DEVICE,
            MEMBERS,
            FIRST_STEADY,
            CONFIGURATION,
            CONFIGURATION_NAME,
        ] {
            assert!(
                REPORT_COLUMNS.contains(&c) || is_known_group(c),
                "{c} is not in manifest::REPORT_COLUMNS"
            );
        }
        let m = Measure::Extra {
            index: 0,
            name: "g".into(),
        };
        let mut made: Vec<String> = Stat::VARIANTS.iter().map(|&s| m.col(s)).collect();
        made.extend([m.ci_low(), m.ci_high()]);
        for c in made {
            let suffix = &c[1..];
            assert!(STAT_SUFFIXES.contains(&suffix), "{suffix}");
        }
        assert!(crate::manifest::group_collides("speedup", &[]).is_some());
        assert!(crate::manifest::group_collides("tokens_per_second_p5", &[]).is_some());
        assert!(crate::manifest::group_collides("mem_gb", &[]).is_none());
        assert!(crate::manifest::group_collides("tps", &["tps"]).is_some());
        assert!(crate::manifest::group_collides("layers", &["model.layers"]).is_some());
    }

    #[test]
    fn aggregated_columns_are_metric_underscore_stat() {
        assert_eq!(
            Field::TokensPerSecond.col(Stat::Mean),
            "tokens_per_second_mean"
        );
        assert_eq!(Field::MfuPct.col(Stat::P95), "mfu_pct_p95");
    }
}
