//! Manifest -> runs, in memory: the sweep expanded (grid x zip, minus exclusions), derived
//! values, each run's configuration, id, name and directory, and the stage jobs it needs.

mod expand;
pub mod identity;
pub mod launch;
pub mod pack;
pub mod record;
pub mod render;
pub mod templates;

pub use crate::manifest::REPEAT;
use crate::template::shell_quote;

pub use crate::config::PretokenizedFormat;
use crate::config::{ModelConfig, PlanHints, SpecialTokens, TrainConfig};
use crate::estimate::memory::MemoryEstimate;
use crate::manifest::{Diagnostics, ExecutorKind, Launcher, Manifest, SlurmSpec};
use indexmap::IndexMap;
use serde::Serialize;
use std::path::PathBuf;

/// What a run executes.
#[derive(Debug, Clone)]
pub enum Job {
    /// `sweep train --config <dir>/config.toml`.
    Train(Box<TrainConfig>),
    /// A rendered command line (already shell-escaped) and its parameters.
    Command(String),
}

#[derive(Debug, Clone)]
pub struct Run {
    /// The hash of the run's identity ([`identity`]): what it trains or measures, and its repeat.
    pub id: String,
    /// The whole hash the id is cut from.
    pub digest: String,
    /// What was hashed (recorded in `run.json`).
    pub identity: serde_json::Value,
    /// The id identity version 1 gave the run: a directory recording it holds this run.
    pub name: String,
    /// The name as written, where making it a directory name changed it.
    pub sanitized_from: Option<String>,
    /// What this run repeats (itself, without repeats).
    pub configuration: record::Configuration,
    /// Axis values and derived values, in axis order: what distinguishes runs.
    pub params: IndexMap<String, serde_json::Value>,
    pub job: Job,
    /// A command run's `launcher`, where the manifest sets one.
    pub launcher: Option<Launcher>,
    /// What the watchdog of its job looks for, where one watches it.
    pub watch: Option<launch::Watch>,
    pub slurm: SlurmSpec,
    /// Index into `Plan::stages` of the stage this run waits for.
    pub stage: Option<usize>,
    pub dir: PathBuf,
    /// Its block and place in a blocked design.
    pub block: Option<record::DesignSlot>,
    /// The trainer's model shape, resolved at planning (a preset's vocabulary from its tokenizer);
    /// none for commands, or where the tokenizer cannot be read (the trainer then says why).
    pub model: Option<ModelConfig>,
}

impl Run {
    /// Processes training together: `nodes × ntasks_per_node`.
    pub fn world_size(&self) -> u32 {
        u32::try_from(self.slurm.tasks()).unwrap_or(u32::MAX)
    }

    /// How the run's processes start under `executor`, or why they cannot.
    pub fn launcher_on(&self, executor: ExecutorKind) -> Result<Launcher, String> {
        let several = self.world_size() > 1;
        use ExecutorKind::{Local, Slurm};
        let chosen = match (&self.job, self.launcher, executor) {
            (Job::Train(_), _, Slurm) => Launcher::Srun,
            (Job::Train(_), _, Local) if several => Launcher::Mpirun,
            (Job::Train(_), _, Local) => Launcher::None,
            (Job::Command(_), Some(chosen), _) => chosen,
            (Job::Command(_), None, _) if !several => Launcher::None,
            (Job::Command(_), None, Slurm) => Launcher::Srun,
            (Job::Command(_), None, Local) => Launcher::Mpirun,
        };
        match (chosen, executor) {
            (Launcher::Srun, Local) => Err(format!(
                "{}: `launcher = \"srun\"` starts ranks on a SLURM cluster, not on this machine: use \"mpirun\" or \"torchrun\" here, or leave `launcher` out",
                self.name
            )),
            _ => Ok(chosen),
        }
    }

    /// What starts the run's processes under `executor`, and the line each runs.
    pub fn launch_on(
        &self,
        executor: ExecutorKind,
        sweep_bin: &str,
    ) -> Result<launch::Launch, String> {
        let line = crate::template::launch_line(&self.command(sweep_bin));
        let (nodes, per_node) = (self.slurm.nodes.get(), self.slurm.ntasks_per_node.get());
        let launch = launch::Launch::new(self.launcher_on(executor)?, nodes, per_node, &line);
        Ok(launch.watched(self.watch.clone()))
    }

    /// Estimated peak memory per device (trainer runs), against the GPU's.
    pub fn memory(&self, hints: &PlanHints) -> Option<Memory> {
        match &self.job {
            Job::Train(cfg) => Some(Memory::of(
                cfg,
                self.model.as_ref()?,
                hints,
                self.world_size() as usize,
            )),
            Job::Command(_) => None,
        }
    }

    /// The scaling forecast of a data-parallel trainer run, where its figures are known.
    pub fn scaling(&self, hints: &PlanHints) -> Option<crate::estimate::scaling::Forecast> {
        use crate::estimate::scaling;
        let Job::Train(cfg) = &self.job else {
            return None;
        };
        let hw = scaling::Hardware::of(cfg, hints)?;
        let model = self.model.as_ref()?;
        let job = scaling::ParallelJob {
            world_size: self.world_size() as usize,
            ranks_per_node: self.slurm.ntasks_per_node.get() as usize,
            overlaps: crate::config::trainer_overlaps_allreduce(cfg.device),
            traffic: scaling::Traffic::Builtin,
        };
        scaling::FITTED.forecast(cfg, hints, model, hw, job)
    }

    /// At `zero` = 0, 1 and 2: the largest batch per device that fits (None: not even 1) and the
    /// states per rank, for a data-parallel trainer run on a GPU of known size.
    pub fn fits_by_zero(
        &self,
        hints: &PlanHints,
    ) -> Option<[(Option<usize>, crate::estimate::memory::States); 3]> {
        let (Job::Train(cfg), Some(model)) = (&self.job, &self.model) else {
            return None;
        };
        let device = crate::estimate::memory::device_bytes(cfg, hints)?;
        let world = self.world_size() as usize;
        if world < 2 {
            return None;
        }
        let at = |zero: u8, batch: usize| {
            let mut c = cfg.clone();
            (c.zero, c.batch_size) = (zero, crate::config::BatchSize::Fixed(batch));
            crate::estimate::memory::estimate_on(&c, model, world)
        };
        let fits = |zero: u8, batch: usize| at(zero, batch).total() <= device;
        Some(std::array::from_fn(|z| {
            let z = z as u8;
            // The estimate grows with the batch: the last that fits, by halving.
            let (mut lo, mut hi) = (0, crate::config::MAX_BATCH_SIZE + 1);
            while hi - lo > 1 {
                let mid = (lo + hi) / 2;
                if fits(z, mid) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            ((lo > 0).then_some(lo), at(z, 1).by_kind)
        }))
    }

    /// Sequences per optimizer step over all ranks (built-in trainer runs).
    pub fn global_batch(&self) -> Option<usize> {
        match &self.job {
            Job::Train(cfg) => {
                let batch = cfg.batch_size.fixed()?;
                (self.world_size() as usize)
                    .checked_mul(batch)?
                    .checked_mul(cfg.gradient_accumulation)
            }
            Job::Command(_) => None,
        }
    }

    /// The program line the job launches (shell syntax, every part quoted).
    pub fn command(&self, sweep_bin: &str) -> String {
        match &self.job {
            Job::Train(_) => format!(
                "{} train --config {}",
                shell_quote(sweep_bin),
                shell_quote(
                    &self
                        .dir
                        .join(crate::layout::CONFIG_TOML)
                        .display()
                        .to_string()
                )
            ),
            Job::Command(c) => c.clone(),
        }
    }
}

/// A pretokenize job shared by every run with the same inputs.
#[derive(Debug, Clone)]
pub struct Stage {
    pub id: String,
    pub name: String,
    pub dataset: PathBuf,
    pub text_column: String,
    pub tokenizer: PathBuf,
    pub sequence_length: usize,
    pub format: PretokenizedFormat,
    pub specials: SpecialTokens,
    pub row_group_size: usize,
    pub dir: PathBuf,
    /// The file training runs read.
    pub output: PathBuf,
    pub slurm: SlurmSpec,
}

impl Stage {
    /// `sweep pretokenize ...` for this stage.
    pub fn command(&self, sweep_bin: &str) -> String {
        let path = |p: &std::path::Path| shell_quote(&p.display().to_string());
        let mut cmd = vec![
            shell_quote(sweep_bin),
            "pretokenize".into(),
            format!("--input {}", path(&self.dataset)),
            format!("--text-column {}", shell_quote(&self.text_column)),
            format!("--tokenizer {}", path(&self.tokenizer)),
            format!("--sequence-length {}", self.sequence_length),
            format!("--format {}", self.format.as_str()),
            format!("--row-group-size {}", self.row_group_size),
            format!("--out {}", path(&self.dir)),
        ];
        for (flag, v) in [
            ("--bos-token", &self.specials.bos),
            ("--eos-token", &self.specials.eos),
            ("--pad-token", &self.specials.pad),
        ] {
            if let Some(v) = v {
                cmd.push(format!("{flag} {}", shell_quote(v)));
            }
        }
        cmd.join(" ")
    }
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub manifest: Manifest,
    pub runs: Vec<Run>,
    pub stages: Vec<Stage>,
    /// `results/<study>`.
    pub study_dir: PathBuf,
    /// The `sweep` binary job scripts run.
    pub sweep_bin: String,
    /// What the plan accepts but a user should hear about, one line each.
    pub warnings: Vec<String>,
}

/// How to plan, decided once by the caller: planning reads no command line or environment.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// Plan runs estimated not to fit their GPU (`--allow-oom`) instead of refusing them.
    pub allow_oom: bool,
    /// The `sweep` binary job scripts run.
    pub sweep_bin: String,
    /// What that binary was built with (which runs it can train).
    pub features: crate::config::Features,
}

impl PlanOptions {
    /// This binary, or `SWEEP_BIN` (a build elsewhere, assumed to have every feature).
    pub fn new(allow_oom: bool, rt: &crate::config::RuntimeOptions) -> PlanOptions {
        let (sweep_bin, features) = match &rt.sweep_bin {
            Some(bin) => (bin.display().to_string(), crate::config::Features::ALL),
            None => (
                std::env::current_exe()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|_| "sweep".into()),
                crate::config::Features::BUILT,
            ),
        };
        PlanOptions {
            allow_oom,
            sweep_bin,
            features,
        }
    }
}

/// A trainer run's estimated peak memory per device, against its GPU's (`gpu_memory_gb`, else
/// the device table's).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Memory {
    pub estimate_bytes: u64,
    pub device_bytes: Option<u64>,
    pub fits: Option<bool>,
    /// Per rank: parameters, gradients, master values, moments.
    pub states: crate::estimate::memory::States,
    #[serde(skip)]
    pub parts: MemoryEstimate,
}

impl Memory {
    pub fn of(
        cfg: &TrainConfig,
        model: &ModelConfig,
        hints: &PlanHints,
        world_size: usize,
    ) -> Memory {
        let parts = crate::estimate::memory::estimate_on(cfg, model, world_size);
        let device_bytes = crate::estimate::memory::device_bytes(cfg, hints);
        Memory {
            estimate_bytes: parts.total(),
            device_bytes,
            fits: device_bytes.map(|d| parts.total() <= d),
            states: parts.by_kind,
            parts,
        }
    }

    /// "35.1 / 80 GB", or "35.1 GB" without a device size.
    pub fn describe(&self) -> String {
        let gb = |b: u64| b as f64 / 1e9;
        match self.device_bytes {
            Some(d) => format!("{:.1} / {:.0} GB", gb(self.estimate_bytes), gb(d)),
            None => format!("{:.1} GB", gb(self.estimate_bytes)),
        }
    }
}

/// Totals shown under `sweep plan`.
#[derive(Debug, Clone, Serialize)]
pub struct Totals {
    pub runs: usize,
    pub jobs: usize,
    pub node_hours: f64,
    pub gpu_hours: f64,
}

impl Plan {
    /// Expands a manifest into runs. Errors point into the manifest.
    pub fn new(manifest: Manifest, opts: &PlanOptions) -> Result<Plan, Diagnostics> {
        let plan = expand::plan(manifest, opts)?;
        // A template that does not exist or parse is the plan's error, not the first render's.
        templates::Templates::load(&plan)?;
        Ok(plan)
    }

    /// The upper bound of node- and GPU-hours: every job runs to its limit.
    pub fn totals(&self) -> Totals {
        let l = pack::load(self, self.manifest.slurm.pack);
        Totals {
            runs: self.runs.len(),
            jobs: l.jobs,
            node_hours: l.node_hours,
            gpu_hours: l.gpu_hours,
        }
    }
}
