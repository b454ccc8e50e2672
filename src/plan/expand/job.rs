//! The job a run needs: its `[slurm]` shape, its ranks and launcher, and
//! what of them makes the run's identity.

use super::values::*;
use super::{Assembly, Shared};
use crate::config::{DeviceKind, TrainConfig};
use crate::manifest::{
    did_you_mean, Diagnostic, ExecutorKind, Launcher, Mode, SlurmSpec, SIGNAL_GRACE,
};
use crate::plan::identity::{RunIdentity, Work};
use serde_json::{json, Value as Json};
use toml::Value;

impl Shared<'_> {
    /// The shape of a run's job, as its identity hashes it: nodes, tasks
    /// and GPUs, and any other `[slurm]` key an axis varies.
    pub(super) fn world(&self, a: &Assembly, slurm: &SlurmSpec) -> Json {
        let mut world = json!({
            "nodes": slurm.nodes,
            "ntasks_per_node": slurm.ntasks_per_node,
            "gpus_per_node": slurm.gpus_per_node,
        });
        // Any other [slurm] key an axis varies (a partition, a time limit)
        // makes runs of their own; studies without such axes keep their ids.
        let swept: serde_json::Map<String, Json> = a
            .params
            .iter()
            .filter_map(|(k, v)| {
                let field = k.strip_prefix("slurm.")?;
                let shape = ["nodes", "ntasks_per_node", "gpus_per_node"].contains(&field);
                (!shape).then(|| (field.to_string(), v.clone()))
            })
            .collect();
        if !swept.is_empty() {
            world["slurm"] = Json::Object(swept);
        }
        world
    }

    /// What makes a run itself: the resolved configuration and the shape of
    /// the job, never the run's name or the manifest's cosmetic fields.
    pub(super) fn identity<'r>(
        &'r self,
        a: &Assembly,
        slurm: &SlurmSpec,
        train: Option<&'r TrainConfig>,
    ) -> RunIdentity<'r> {
        let m = self.m;
        RunIdentity {
            work: match (train, &m.mode) {
                (Some(cfg), _) => Work::Train(cfg),
                (None, Mode::Command(cmd)) => Work::Command {
                    command: cmd,
                    params: table_json(&a.table, &a.params),
                },
                (None, Mode::Train(_)) => unreachable!("a training study resolves a configuration"),
            },
            world: self.world(a, slurm),
            local: (m.executor == Some(ExecutorKind::Local))
                .then_some((m.local.threads, m.local.parallel)),
        }
    }

    /// A command run's `launcher`, where it sets one: a known name that can
    /// start the run where it runs (a packed run is a job step, which only
    /// `srun` places; `srun` needs SLURM).
    pub(super) fn launcher(
        &self,
        a: &Assembly,
        slurm: &SlurmSpec,
    ) -> Result<Option<Launcher>, Box<Diagnostic>> {
        let Some(value) = a.table.get("launcher") else {
            if slurm.tasks() == 1 && !slurm.srun_args.is_empty() {
                let msg = "`srun_args` are given to srun, and a command run of one task has no launcher: it runs as written in its job script; set `launcher = \"srun\"` in [defaults] to start it with srun";
                return Err(self.error_in(&a.params, Some("slurm.srun_args"), msg));
            }
            return Ok(None);
        };
        let names = <Launcher as strum::VariantNames>::VARIANTS;
        let parsed = value.as_str().and_then(|s| s.parse::<Launcher>().ok());
        let launcher = parsed.ok_or_else(|| {
            let hint = match value
                .as_str()
                .and_then(|s| did_you_mean(s, names.iter().copied()))
            {
                Some(n) => format!(" (did you mean `{n}`?)"),
                None => String::new(),
            };
            let msg = format!(
                "`launcher = {value}` is not a launcher{hint}: use one of {}",
                names
                    .iter()
                    .map(|n| format!("\"{n}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            self.error_in(&a.params, Some("launcher"), &msg)
        })?;
        let local = self.m.executor == Some(ExecutorKind::Local);
        let why = match launcher {
            Launcher::Srun if local => "`launcher = \"srun\"` starts ranks on a SLURM cluster, and this study runs on this machine (`executor = \"local\"`): use \"mpirun\" or \"torchrun\", or leave `launcher` out",
            Launcher::Mpirun if slurm.pack => "a packed run (`[slurm] pack`) is a job step of its block, which `mpirun` cannot place: use \"srun\" or \"torchrun\"",
            Launcher::None | Launcher::Mpirun if !slurm.srun_args.is_empty() => "`[slurm] srun_args` are given to srun, which this launcher does not use: remove them, or use \"srun\" or \"torchrun\"",
            _ => return Ok(Some(launcher)),
        };
        Err(self.error_in(&a.params, Some("launcher"), why))
    }

    /// The run's `[slurm]`.
    pub(super) fn slurm(&self, a: &Assembly) -> Result<SlurmSpec, Box<Diagnostic>> {
        let mut spec: SlurmSpec = Value::Table(a.slurm.clone())
            .try_into()
            .map_err(|e: toml::de::Error| self.error_in(&a.params, Some("slurm"), e.message()))?;
        if !matches!(self.m.mode, Mode::Command(_)) {
            spec.signal_grace.get_or_insert(SIGNAL_GRACE);
        }
        spec.check()
            .and_then(|()| crate::manifest::check_owned_options(&spec))
            .map_err(|(key, msg)| self.error_in(&a.params, Some(&format!("slurm.{key}")), &msg))?;
        Ok(spec)
    }

    /// A built-in trainer run with several tasks is one data-parallel job:
    /// its engine must be built in, each task drives one GPU, and `srun`
    /// starts the ranks with MPI's process management and stops them all
    /// when one dies.
    pub(super) fn ranks(
        &self,
        a: &Assembly,
        slurm: &mut SlurmSpec,
        cfg: &TrainConfig,
    ) -> Result<(), Box<Diagnostic>> {
        let tasks = slurm.tasks();
        if tasks <= 1 && cfg.zero > 0 {
            let msg = format!(
                "`zero = {}` shards the optimizer over the data-parallel ranks, and this run has one: \
                 give it several (`slurm.nodes` × `slurm.ntasks_per_node`), or `zero = 0`",
                cfg.zero
            );
            return Err(self.error_in(&a.params, Some("zero"), &msg));
        }
        if tasks <= 1 {
            return Ok(());
        }
        if cfg.batch_size == crate::config::BatchSize::Max {
            let msg = format!(
                "`batch_size = \"max\"` is searched on one device, and this run has {tasks} ranks: give it a number"
            );
            return Err(self.error_in(&a.params, Some("batch_size"), &msg));
        }
        let key = if slurm.ntasks_per_node.get() > 1 {
            "slurm.ntasks_per_node"
        } else {
            "slurm.nodes"
        };
        let cpu = cfg.device == DeviceKind::Cpu;
        let missing = match cpu {
            true if !self.features.mpi => {
                Some(("MPI", "mpi", "cargo build --release --features mpi"))
            }
            false if !self.features.nccl => Some(("NCCL", "nccl", "scripts/build-gpu.sh")),
            _ => None,
        };
        if let Some((engine, feature, build)) = missing {
            let msg = format!(
                "`{key}`: {tasks} ranks of the built-in trainer sum their gradients with {engine}, \
                 and this sweep was built without the `{feature}` feature"
            );
            let mut d = self.error_in(&a.params, Some(key), &msg);
            d.help = Some(format!("build it with `{build}` (docs/data-parallelism.md), set SWEEP_BIN to such a build, or use one task"));
            return Err(d);
        }
        if !cpu && slurm.gpus_per_node > 0 && slurm.gpus_per_node != slurm.ntasks_per_node.get() {
            let msg = format!(
                "`slurm.ntasks_per_node` = {} but `slurm.gpus_per_node` = {}: the built-in trainer runs one rank per GPU",
                slurm.ntasks_per_node, slurm.gpus_per_node
            );
            return Err(self.error_in(&a.params, Some("slurm.ntasks_per_node"), &msg));
        }
        let has = |args: &[String], prefixes: &[&str]| {
            args.iter()
                .any(|arg| prefixes.iter().any(|p| arg.starts_with(p)))
        };
        if !has(&slurm.srun_args, &["--kill-on-bad-exit", "-K"]) {
            slurm.srun_args.push("--kill-on-bad-exit=1".into());
        }
        if cpu && !has(&slurm.srun_args, &["--mpi"]) {
            slurm.srun_args.push("--mpi=pmix".into());
        }
        Ok(())
    }
}
