//! The manifest's sections as serde types: unknown keys rejected, every field but `name` defaulted.

use super::report::ReportSpec;
use anyhow::{bail, Result};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;

/// The file as written; `Manifest` is what validation makes of it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ManifestFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// A command template for any program; without it, the built-in trainer runs `[defaults]`.
    pub command: Option<String>,
    /// The executor `sweep submit`/`sweep run` use when `--executor` is not given.
    pub executor: Option<ExecutorKind>,
    #[serde(default)]
    pub defaults: toml::Table,
    #[serde(default)]
    pub sweep: SweepFile,
    #[serde(default)]
    pub slurm: SlurmSpec,
    #[serde(default)]
    pub local: LocalSpec,
    #[serde(default)]
    pub stages: StagesSpec,
    #[serde(default)]
    pub report: ReportSpec,
    #[serde(default)]
    pub environment: EnvironmentSpec,
    #[serde(default)]
    pub watchdog: super::watchdog::WatchdogSpec,
    /// What `sweep plan` assumes of the hardware (never part of a run).
    #[serde(default)]
    pub plan: crate::config::PlanHints,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SweepFile {
    /// key -> list of values; the cartesian product of all of them.
    #[serde(default)]
    pub grid: toml::Table,
    /// Groups of equal-length lists, zipped element by element.
    #[serde(default)]
    pub zip: Vec<toml::Table>,
    /// Combinations to leave out: every key of a rule must match.
    #[serde(default)]
    pub exclude: Vec<toml::Table>,
    /// key -> minijinja expression (or template with `{{ }}`), in order.
    #[serde(default)]
    pub derived: toml::Table,
    /// The run-name template.
    pub name: Option<String>,
    /// The most runs the sweep may expand to (default [`DEFAULT_MAX_RUNS`]).
    pub max_runs: Option<u64>,
    /// Every configuration runs this many times, as separate runs (default 1).
    pub repeats: Option<u32>,
    /// Repeat k trains with `seed + k` instead of the same seed.
    #[serde(default)]
    pub seed_per_repeat: bool,
    /// How the runs are ordered: repeats interleaved (the default), or randomized blocks.
    pub design: Option<Design>,
    /// The seed of the blocks' orders (default 0).
    pub order_seed: Option<u64>,
}

/// `[sweep] design`: the order runs go out in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Design {
    /// Every configuration once, then every one again, in the sweep's order.
    #[default]
    Interleaved,
    /// Randomized blocks: one run of every configuration per block, ordered from `order_seed`.
    Blocks,
}

/// The largest sweep expanded unless `[sweep] max_runs` raises it: far above a real study,
/// far below what exhausts memory.
pub const DEFAULT_MAX_RUNS: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    Local,
    Slurm,
}

/// How a `command` run's processes start (`[defaults] launcher`), and so which rank variables
/// they see; left out: none for one rank, else the executor's own (docs/manifest.md).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantNames,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Launcher {
    /// The command runs once, as written, with no rank variables.
    None,
    /// One process per task, started by SLURM's `srun`.
    Srun,
    /// One process per task, started by `mpirun`.
    Mpirun,
    /// PyTorch's `torchrun`, once per node, one process per task, rendezvous at the first node.
    Torchrun,
}

impl Launcher {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// `[slurm]`: what every job asks of the scheduler; axes vary them as `slurm.<key>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmSpec {
    pub account: Option<String>,
    pub partition: Option<String>,
    pub qos: Option<String>,
    /// Time limit: `MM`, `HH:MM:SS` or `D-HH:MM:SS`.
    pub time: SlurmTime,
    pub nodes: NonZeroU32,
    pub ntasks_per_node: NonZeroU32,
    pub gpus_per_node: u32,
    pub cpus_per_task: Option<u32>,
    pub mem: Option<String>,
    pub constraint: Option<String>,
    /// CSCS container engine environment (`--environment=`).
    pub environment: Option<String>,
    /// Job name; the study name by default.
    pub job_name: Option<String>,
    /// Extra `#SBATCH` lines, written as given (e.g. `--exclusive`).
    pub extra_sbatch: Vec<String>,
    /// Environment variables exported before the program starts.
    pub env: IndexMap<String, String>,
    /// Shell lines run before the program (module loads, venv activation).
    pub setup: Vec<String>,
    /// Extra arguments to `srun`.
    pub srun_args: Vec<String>,
    /// At most this many tasks of a job array run at once (`%N`).
    pub array_throttle: Option<u32>,
    /// `auto` (by `nodes`), `single-node`, `multi-node`, or a template file path.
    pub template: TemplateChoice,
    /// Seconds before the time limit at which SLURM sends SIGUSR1. Unset: [`SIGNAL_GRACE`] for the
    /// trainer (it checkpoints and requeues), none for a `command` (SIGUSR1 would kill it).
    pub signal_grace: Option<u32>,
    pub requeue: bool,
    pub master_port: u16,
    /// A blocked design's blocks each as one job: one allocation, its runs as job steps.
    pub pack: bool,
}

impl Default for SlurmSpec {
    fn default() -> Self {
        SlurmSpec {
            account: None,
            partition: None,
            qos: None,
            time: SlurmTime::parse("01:00:00").expect("a SLURM time"),
            nodes: NonZeroU32::MIN,
            ntasks_per_node: NonZeroU32::MIN,
            gpus_per_node: 0,
            cpus_per_task: None,
            mem: None,
            constraint: None,
            environment: None,
            job_name: None,
            extra_sbatch: Vec::new(),
            env: IndexMap::new(),
            setup: Vec::new(),
            srun_args: Vec::new(),
            array_throttle: None,
            template: TemplateChoice::Auto,
            signal_grace: None,
            requeue: true,
            master_port: 29500,
            pack: false,
        }
    }
}

/// The trainer's warning before its time limit: time to checkpoint and requeue.
pub const SIGNAL_GRACE: u32 = 120;

/// The longest job name whose log, `<job name>-<job id>_<task>.out`, fits a 255-byte file name.
const MAX_JOB_NAME: usize = 200;

/// Why SLURM could not start a job of this name (a `/`, or too long for its log's name).
fn job_name_fault(name: &str) -> Option<String> {
    if name.trim().is_empty() {
        return Some("`job_name` is empty: leave it out for the study's name".into());
    }
    let why = if name.contains('/') {
        "holds `/`".to_string()
    } else if name.len() > MAX_JOB_NAME {
        format!("is {} bytes long, over {MAX_JOB_NAME}", name.len())
    } else {
        return None;
    };
    Some(format!(
        "the job name `{}` {why}: each job's log is `<job name>-<job id>.out` in its run's directory, which SLURM could not open, and every job would fail to launch",
        crate::util::text::note(name)
    ))
}

impl SlurmSpec {
    /// Every count within what a cluster has, and a usable job name: else the key at fault and why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if let Some(why) = self.job_name.as_deref().and_then(job_name_fault) {
            return Err(("job_name", why));
        }
        // Nodes and tasks are checked elsewhere: their product must fit a job.
        let counts: [(&'static str, u64, u64, u64); 5] = [
            ("gpus_per_node", self.gpus_per_node.into(), 0, 64),
            (
                "cpus_per_task",
                self.cpus_per_task.unwrap_or(1).into(),
                1,
                crate::config::MAX_THREADS as u64,
            ),
            (
                "array_throttle",
                self.array_throttle.unwrap_or(1).into(),
                1,
                100_000,
            ),
            (
                "signal_grace",
                self.signal_grace.unwrap_or(0).into(),
                0,
                86_400,
            ),
            ("master_port", self.master_port.into(), 1, 65_535),
        ];
        for (key, v, least, most) in counts {
            if !(least..=most).contains(&v) {
                return Err((
                    key,
                    format!("`slurm.{key}` must be a whole number in {least}..={most}, not {v}"),
                ));
            }
        }
        Ok(())
    }

    /// Processes of the job: `nodes × ntasks_per_node` (no overflow in u64).
    pub fn tasks(&self) -> u64 {
        u64::from(self.nodes.get()) * u64::from(self.ntasks_per_node.get())
    }
}

/// The job-script template: a built-in one (or the project's copy), or the user's own file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateChoice {
    /// `single-node` on one node, `multi-node` on several.
    Auto,
    SingleNode,
    MultiNode,
    Pretokenize,
    /// A template file, relative to the project root unless absolute.
    File(std::path::PathBuf),
}

impl TemplateChoice {
    /// The names manifests use for the built-in templates.
    pub const NAMES: [&'static str; 4] = ["auto", "single-node", "multi-node", "pretokenize"];

    pub fn parse(s: &str) -> std::result::Result<TemplateChoice, String> {
        Ok(match s {
            "auto" => TemplateChoice::Auto,
            "single-node" => TemplateChoice::SingleNode,
            "multi-node" => TemplateChoice::MultiNode,
            "pretokenize" => TemplateChoice::Pretokenize,
            // A path: it has a directory or the templates' extension.
            s if s.contains('/') || s.ends_with(".j2") => TemplateChoice::File(s.into()),
            s => {
                let hint = match super::did_you_mean(s, Self::NAMES.iter().copied()) {
                    Some(n) => format!("did you mean `{n}`?"),
                    None => format!(
                        "use one of {} or the path of a template file",
                        Self::NAMES.join(", ")
                    ),
                };
                return Err(format!("unknown template `{}`: {hint}", s.escape_debug()));
            }
        })
    }

    pub fn as_str(&self) -> std::borrow::Cow<'_, str> {
        match self {
            TemplateChoice::Auto => "auto".into(),
            TemplateChoice::SingleNode => "single-node".into(),
            TemplateChoice::MultiNode => "multi-node".into(),
            TemplateChoice::Pretokenize => "pretokenize".into(),
            TemplateChoice::File(p) => p.to_string_lossy(),
        }
    }
}

impl Serialize for TemplateChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.as_str())
    }
}

impl<'de> Deserialize<'de> for TemplateChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        TemplateChoice::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A SLURM time limit, as written (for `#SBATCH --time`) and in seconds, refused where written
/// when it does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmTime {
    text: String,
    seconds: u64,
}

impl SlurmTime {
    pub fn parse(s: &str) -> Result<SlurmTime> {
        Ok(SlurmTime {
            text: s.to_string(),
            seconds: parse_slurm_time(s)?,
        })
    }

    pub fn seconds(&self) -> u64 {
        self.seconds
    }

    /// As written.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl Serialize for SlurmTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for SlurmTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        SlurmTime::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The longest time limit written: a year (beyond it, a typo).
const MAX_TIME_SECONDS: u64 = 366 * 86400;

/// SLURM's time formats: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`.
pub fn parse_slurm_time(s: &str) -> Result<u64> {
    let bad = || {
        anyhow::anyhow!(
            "`{}` is not a SLURM time (use MM, HH:MM:SS or D-HH:MM:SS)",
            s.escape_debug()
        )
    };
    let num = |p: &str| {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.len() > 12 {
            return Err(bad());
        }
        p.parse::<u64>().map_err(|_| bad())
    };
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (Some(num(d)?), r),
        None => (None, s),
    };
    let parts: Vec<u64> = rest.split(':').map(num).collect::<Result<_>>()?;
    // Each part at most 12 digits: no product below overflows.
    let secs = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) | (Some(_), [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(_), [h]) => h * 3600,
        (Some(_), [h, m]) => h * 3600 + m * 60,
        _ => return Err(bad()),
    };
    let total = days.unwrap_or(0) * 86400 + secs;
    if total == 0 {
        bail!("the time limit `{s}` is zero");
    }
    if total > MAX_TIME_SECONDS {
        bail!("the time limit `{s}` is more than a year");
    }
    Ok(total)
}

/// `[local]`: the executor that runs jobs on this machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalSpec {
    /// Runs at a time.
    pub parallel: usize,
    /// CPU threads per run (0: the machine's cores divided by `parallel`).
    pub threads: usize,
}

impl Default for LocalSpec {
    fn default() -> Self {
        LocalSpec {
            parallel: 1,
            threads: 0,
        }
    }
}

/// `[environment]`: what jobs record beyond what sweep finds (`environment.json`), and the
/// system the history groups them under. Never part of a run's identity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvironmentSpec {
    /// The system's name in the history (default `<cluster>/<partition>`, or `local/<host>`).
    pub system: Option<String>,
    /// name -> shell command run once per job; its output is recorded.
    pub probes: IndexMap<String, String>,
}

/// The most probes a manifest declares (each runs at the start of every job).
pub const MAX_PROBES: usize = 32;

/// `[stages]`: jobs that runs depend on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StagesSpec {
    pub pretokenize: PretokenizeStageSpec,
}

/// The pretokenize stage: one job per distinct (dataset, tokenizer, length, format).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PretokenizeStageSpec {
    pub enabled: bool,
    pub row_group_size: usize,
    /// Overrides of the `[slurm]` values for the stage job.
    pub time: Option<SlurmTime>,
    pub cpus_per_task: Option<u32>,
    pub partition: Option<String>,
    pub mem: Option<String>,
    pub template: TemplateChoice,
}

impl Default for PretokenizeStageSpec {
    fn default() -> Self {
        PretokenizeStageSpec {
            enabled: true,
            row_group_size: 1000,
            time: None,
            cpus_per_task: None,
            partition: None,
            mem: None,
            template: TemplateChoice::Pretokenize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_name_must_be_able_to_name_its_log() {
        let named = |name: &str| {
            SlurmSpec {
                job_name: Some(name.into()),
                ..SlurmSpec::default()
            }
            .check()
        };
        let (key, why) = named("llama/7b").unwrap_err();
        assert_eq!(key, "job_name");
        assert!(
            why.contains("holds `/`") && why.contains("fail to launch"),
            "{why}"
        );
        assert!(named(&"x".repeat(201)).unwrap_err().1.contains("201 bytes"));
        assert!(named(" ").unwrap_err().1.contains("is empty"));
        // SLURM names their logs as they are (tried on the local cluster).
        for ok in ["a b", "a%j", "it's", "llama-7b_bs32", &"x".repeat(200)] {
            assert_eq!(named(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn slurm_times() {
        assert_eq!(parse_slurm_time("30").unwrap(), 1800);
        assert_eq!(parse_slurm_time("00:14:59").unwrap(), 899);
        assert_eq!(parse_slurm_time("1-00:00:00").unwrap(), 86400);
        assert_eq!(parse_slurm_time("2-3").unwrap(), 2 * 86400 + 3 * 3600);
        assert!(parse_slurm_time("1:2:3:4").is_err());
        assert!(parse_slurm_time("abc").is_err());
        assert!(parse_slurm_time("0").is_err());
        assert!(parse_slurm_time("-5").is_err());
        assert!(parse_slurm_time("1-").is_err());
        assert!(parse_slurm_time("+5").is_err());
        assert!(parse_slurm_time("99999999999999999999").is_err());
        assert!(
            parse_slurm_time("999999999999-0").is_err(),
            "overflows nothing, refused"
        );
        assert!(parse_slurm_time("400-0")
            .unwrap_err()
            .to_string()
            .contains("more than a year"));
    }
}
