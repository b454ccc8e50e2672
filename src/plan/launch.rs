//! How a run's processes are started, in one place for SLURM's job scripts
//! and the local executor: which launcher starts how many processes on how
//! many nodes, and the shell line each process runs, which sets the rank
//! variables (all of them, or none: docs/manifest.md lists them).

use crate::manifest::RANK_VARIABLES;
use crate::manifest::{Launcher, Stall, WatchdogSpec};
use crate::template::shell_quote;
use serde::Serialize;

/// One run's launch: what the job script (or the local executor) starts.
/// `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` come
/// from the job's environment; each process's line sets its own ranks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Launch {
    pub launcher: Launcher,
    /// Processes the launcher itself is asked to start (`srun`'s tasks,
    /// `mpirun -n`; one `torchrun` per node).
    pub tasks: u32,
    /// Nodes they start on.
    pub nodes: u32,
    pub tasks_per_node: u32,
    /// The run's processes: `nodes × ntasks_per_node` with a launcher.
    pub world_size: u32,
    /// `ntasks_per_node`: the processes on each node.
    pub local_world_size: u32,
    /// The shell line each started process runs.
    pub line: String,
    /// The run's program line in it, as [`crate::template::launch_line`]
    /// made it.
    pub command: String,
    /// The watchdog that starts the launcher and stops a run that stops
    /// making progress (`sweep watchdog`), where one watches this run.
    pub watch: Option<Watch>,
}

/// What a run's watchdog looks for: `[watchdog]` and, for a command, the
/// `[report] line_pattern` its progress lines match (the built-in trainer
/// reports each rank's steps in the run's `progress/`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Watch {
    /// `auto`, `off` or `<seconds>s`.
    pub stall: String,
    /// `<seconds>s`, or none for "off".
    pub startup: Option<String>,
    pub pattern: Option<String>,
}

impl Watch {
    /// The watchdog of a run: built-in trainer runs and command runs with a
    /// `line_pattern`, unless both limits are off.
    pub fn of(spec: &WatchdogSpec, job: &super::Job, pattern: Option<&str>) -> Option<Watch> {
        let pattern = match job {
            super::Job::Train(_) => None,
            super::Job::Command(_) => Some(pattern?.to_string()),
        };
        if spec.stall == Stall::Off && spec.startup.is_none() {
            return None;
        }
        Some(Watch {
            stall: spec.stall.as_arg(),
            startup: spec.startup.map(|s| format!("{s}s")),
            pattern,
        })
    }

    /// `sweep watchdog`'s arguments after `--dir <run dir>`, up to the `--`
    /// that precedes the launcher.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec!["--stall".to_string(), self.stall.clone()];
        if let Some(s) = &self.startup {
            a.extend(["--startup".to_string(), s.clone()]);
        }
        if let Some(p) = &self.pattern {
            a.extend(["--pattern".to_string(), p.clone()]);
        }
        a
    }
}

impl Launch {
    /// `command` is the run's program line as [`crate::template::launch_line`]
    /// made it; `nodes` and `per_node` the job's shape.
    pub fn new(launcher: Launcher, nodes: u32, per_node: u32, command: &str) -> Launch {
        let world_size = nodes.saturating_mul(per_node);
        let (tasks, nodes_used, tasks_per_node, line) = match launcher {
            Launcher::None => (
                1,
                1,
                1,
                format!("unset {}\n{command}", RANK_VARIABLES.join(" ")),
            ),
            // srun's and mpirun's own variables name each task's ranks.
            Launcher::Srun => (
                world_size,
                nodes,
                per_node,
                format!("export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID NODE_RANK=$SLURM_NODEID\n{command}"),
            ),
            // Open MPI's names, else MPICH's (Hydra). MPI names no node
            // index: the job script maps `ntasks_per_node` ranks to each
            // node in turn, so a rank's node is its rank over that.
            Launcher::Mpirun => (
                world_size,
                nodes,
                per_node,
                format!("export RANK=${{OMPI_COMM_WORLD_RANK:-$PMI_RANK}} LOCAL_RANK=${{OMPI_COMM_WORLD_LOCAL_RANK:-$MPI_LOCALRANKID}}\nexport NODE_RANK=$(( RANK / LOCAL_WORLD_SIZE ))\n{command}"),
            ),
            // One torchrun per node; it starts that node's processes and
            // gives them every variable, its rendezvous (a static one) at
            // MASTER_ADDR:MASTER_PORT on the first node.
            Launcher::Torchrun => (
                nodes,
                nodes,
                1,
                format!(
                    "exec torchrun --nnodes={nodes} --nproc-per-node={per_node} --node-rank=\"${{SLURM_NODEID:-0}}\" \
                     --master-addr=\"$MASTER_ADDR\" --master-port=\"$MASTER_PORT\" --no-python bash -c {}",
                    shell_quote(command)
                ),
            ),
        };
        Launch {
            launcher,
            tasks,
            nodes: nodes_used,
            tasks_per_node,
            world_size,
            local_world_size: per_node,
            line,
            command: command.to_string(),
            watch: None,
        }
    }

    pub fn watched(self, watch: Option<Watch>) -> Launch {
        Launch { watch, ..self }
    }

    /// The job's environment for this launch: the world's size and its
    /// rendezvous, for a launcher; nothing for none.
    pub fn environment(&self, master_addr: &str, master_port: u16) -> Vec<(&'static str, String)> {
        match self.launcher {
            Launcher::None => Vec::new(),
            _ => vec![
                ("WORLD_SIZE", self.world_size.to_string()),
                ("LOCAL_WORLD_SIZE", self.local_world_size.to_string()),
                ("MASTER_ADDR", master_addr.to_string()),
                ("MASTER_PORT", master_port.to_string()),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_launcher_starts_its_processes_with_every_rank_variable_or_none() {
        let none = Launch::new(Launcher::None, 2, 4, "exec prog");
        assert_eq!((none.tasks, none.nodes), (1, 1));
        assert!(none.line.starts_with(
            "unset RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT NODE_RANK\n"
        ));
        assert!(none.environment("h", 1).is_empty());

        let srun = Launch::new(Launcher::Srun, 2, 4, "exec prog");
        assert_eq!((srun.tasks, srun.nodes, srun.tasks_per_node), (8, 2, 4));
        let env = srun.environment("h", 29500);
        let names: Vec<&str> = env.iter().map(|(k, _)| *k).collect();
        for v in RANK_VARIABLES {
            assert!(
                names.contains(&v) || srun.line.contains(&format!("{v}=")),
                "{v}"
            );
        }

        let torchrun = Launch::new(Launcher::Torchrun, 2, 4, "exec python3 'my train.py'");
        assert_eq!(
            (torchrun.tasks, torchrun.tasks_per_node, torchrun.world_size),
            (2, 1, 8)
        );
        assert!(torchrun.line.contains("--nnodes=2 --nproc-per-node=4"));
        assert!(
            torchrun
                .line
                .ends_with("--no-python bash -c 'exec python3 '\\''my train.py'\\'''"),
            "{}",
            torchrun.line
        );
    }
}
