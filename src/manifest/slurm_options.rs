//! The sbatch and srun options sweep's job scripts set, in one table: the header is written
//! from it; `extra_sbatch` and `srun_args` may not set them again (the later line wins, undoing
//! sweep's unseen); their `SBATCH_*` variables are left out of sbatch's environment; packed
//! blocks take them from their allocation. Also the variables a study's `env` may not set.

use super::schema::SlurmSpec;
use crate::util::slurm::{first_operand, is_long_option, options, Tool};
use minijinja::Value;
use std::path::Path;

/// One job of a study, as the header writes it.
pub struct Job<'a> {
    pub spec: &'a SlurmSpec,
    pub name: &'a str,
    /// Its directory, where its log goes.
    pub dir: &'a Path,
}

/// How a packed block (`[slurm] pack`) treats an option of its runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum InBlock {
    /// The block's runs must share it: the block's job asks for it once.
    Shared,
    /// The block's allocation gives its own (the largest of its runs', the sum of their times).
    Allocation,
    /// The block's script writes its own (its log).
    Own,
}

/// An option sweep's scripts set, or one whose input variable would override an `#SBATCH` line.
pub struct SlurmOption {
    /// The long name.
    pub name: &'static str,
    /// The `[slurm]` key that sets it.
    pub key: Option<&'static str>,
    /// The header's value for a job ("" for a flag), where it writes one.
    header: fn(&Job) -> Option<Value>,
    /// Set by sweep whatever the header reads (`--error`, `--ntasks`, an array's, a dependency's).
    always: bool,
    /// Whether the run's srun line sets it.
    srun: fn(&SlurmSpec) -> bool,
    pub in_block: InBlock,
    /// sbatch's input variables for it, which win over the script's line.
    pub env: &'static [&'static str],
}

impl SlurmOption {
    /// Whether `tool`'s invocation in a job of `spec` has it set by sweep.
    fn set_by_sweep(&self, tool: Tool, spec: &SlurmSpec) -> bool {
        let unnamed = Job {
            spec,
            name: "",
            dir: Path::new(""),
        };
        match tool {
            Tool::Sbatch => self.always || (self.header)(&unnamed).is_some(),
            Tool::Srun => (self.srun)(spec),
        }
    }
}

fn unwritten(_: &Job) -> Option<Value> {
    None
}
fn never(_: &SlurmSpec) -> bool {
    false
}
fn always(_: &SlurmSpec) -> bool {
    true
}
fn packed(s: &SlurmSpec) -> bool {
    s.pack
}
fn text(s: &Option<String>) -> Option<Value> {
    s.as_deref().map(Value::from)
}
fn flag(on: bool) -> Option<Value> {
    on.then(|| Value::from(""))
}

const fn row(name: &'static str, key: Option<&'static str>) -> SlurmOption {
    SlurmOption {
        name,
        key,
        header: unwritten,
        always: false,
        srun: never,
        in_block: InBlock::Shared,
        env: &[],
    }
}

/// Every option sweep's scripts set, in the header's order (docs/extending.md: adding one).
/// Each would undo what sweep records if set again.
pub const SLURM_OPTIONS: [SlurmOption; 26] = [
    SlurmOption {
        header: |j| Some(Value::from(j.name)),
        env: &["SBATCH_JOB_NAME"],
        ..row("job-name", Some("job_name"))
    },
    SlurmOption {
        // One value, quoted by the engine, which refuses a line break in it.
        header: |j| Some(Value::from(format!("{}/%x-%j.out", j.dir.display()))),
        srun: always,
        in_block: InBlock::Own,
        env: &["SBATCH_OUTPUT", "SBATCH_ERROR"],
        ..row("output", None)
    },
    SlurmOption {
        always: true,
        srun: always,
        env: &["SBATCH_ERROR"],
        ..row("error", None)
    },
    SlurmOption {
        header: |_| Some(Value::from("append")),
        env: &["SBATCH_OPEN_MODE"],
        ..row("open-mode", None)
    },
    SlurmOption {
        header: |j| Some(Value::from(j.spec.time.text())),
        srun: packed,
        in_block: InBlock::Allocation,
        env: &["SBATCH_TIMELIMIT"],
        ..row("time", Some("time"))
    },
    SlurmOption {
        header: |j| Some(Value::from(j.spec.nodes.get())),
        srun: always,
        in_block: InBlock::Allocation,
        ..row("nodes", Some("nodes"))
    },
    SlurmOption {
        header: |j| Some(Value::from(j.spec.ntasks_per_node.get())),
        srun: always,
        in_block: InBlock::Allocation,
        ..row("ntasks-per-node", Some("ntasks_per_node"))
    },
    SlurmOption {
        always: true,
        srun: always,
        in_block: InBlock::Allocation,
        ..row("ntasks", Some("ntasks_per_node"))
    },
    SlurmOption {
        header: |j| (j.spec.gpus_per_node > 0).then(|| Value::from(j.spec.gpus_per_node)),
        srun: |s| s.pack && s.gpus_per_node > 0,
        in_block: InBlock::Allocation,
        env: &["SBATCH_GPUS_PER_NODE"],
        ..row("gpus-per-node", Some("gpus_per_node"))
    },
    SlurmOption {
        header: |j| j.spec.cpus_per_task.map(Value::from),
        srun: |s| s.pack && s.cpus_per_task.is_some(),
        in_block: InBlock::Allocation,
        ..row("cpus-per-task", Some("cpus_per_task"))
    },
    SlurmOption {
        header: |j| text(&j.spec.mem),
        in_block: InBlock::Allocation,
        env: &[
            "SBATCH_MEM_PER_NODE",
            "SBATCH_MEM_PER_CPU",
            "SBATCH_MEM_PER_GPU",
        ],
        ..row("mem", Some("mem"))
    },
    SlurmOption {
        header: |j| text(&j.spec.account),
        env: &["SBATCH_ACCOUNT"],
        ..row("account", Some("account"))
    },
    SlurmOption {
        header: |j| text(&j.spec.partition),
        env: &["SBATCH_PARTITION"],
        ..row("partition", Some("partition"))
    },
    SlurmOption {
        header: |j| text(&j.spec.qos),
        env: &["SBATCH_QOS"],
        ..row("qos", Some("qos"))
    },
    SlurmOption {
        header: |j| text(&j.spec.constraint),
        env: &["SBATCH_CONSTRAINT"],
        ..row("constraint", Some("constraint"))
    },
    SlurmOption {
        header: |j| text(&j.spec.environment),
        ..row("environment", Some("environment"))
    },
    SlurmOption {
        header: |j| flag(j.spec.requeue),
        always: true,
        env: &["SBATCH_REQUEUE", "SBATCH_NO_REQUEUE"],
        ..row("requeue", Some("requeue"))
    },
    // Written with `--requeue`; the trainer's runs have a grace by default.
    SlurmOption {
        header: |j| match (j.spec.requeue, j.spec.signal_grace) {
            (true, Some(grace)) => Some(Value::from(format!("USR1@{grace}"))),
            _ => None,
        },
        env: &["SBATCH_SIGNAL"],
        ..row("signal", Some("signal_grace"))
    },
    SlurmOption {
        header: |j| flag(!j.spec.requeue),
        always: true,
        env: &["SBATCH_REQUEUE", "SBATCH_NO_REQUEUE"],
        ..row("no-requeue", Some("requeue"))
    },
    SlurmOption {
        always: true,
        ..row("array", None)
    },
    SlurmOption {
        always: true,
        ..row("dependency", None)
    },
    // A packed run's job step: its first node in the block's allocation.
    SlurmOption {
        srun: packed,
        ..row("relative", None)
    },
    // Not sweep's, but their variables would override an `extra_sbatch` line.
    SlurmOption {
        env: &["SBATCH_EXCLUSIVE"],
        ..row("exclusive", None)
    },
    SlurmOption {
        env: &["SBATCH_GPUS"],
        ..row("gpus", None)
    },
    SlurmOption {
        env: &["SBATCH_GRES"],
        ..row("gres", None)
    },
    SlurmOption {
        env: &["SBATCH_RESERVATION"],
        ..row("reservation", None)
    },
];

/// A job's `#SBATCH` options as the header writes them: (name, value; "" for a flag).
pub fn header(job: &Job) -> Vec<(&'static str, Value)> {
    SLURM_OPTIONS
        .iter()
        .filter_map(|o| Some((o.name, (o.header)(job)?)))
        .collect()
}

/// Options that change what sbatch does, not the job (it would wait for each job, or get none).
const SBATCH_ACTIONS: [(&str, &str); 5] = [
    ("wait", "makes sbatch wait for the job to end: `sweep submit` would wait for each job in turn (`sweep run` submits a study and follows its jobs)"),
    ("test-only", "makes sbatch only say when the job would start: no job is queued"),
    ("help", "makes sbatch print its help: no job is queued"),
    ("usage", "makes sbatch print its usage: no job is queued"),
    ("version", "makes sbatch print its version: no job is queued"),
];

/// Whether `tool` reads `name` as `option`: its name, or its unambiguous start (`--part=debug`)
/// where `name` is no option of its own.
fn reads_as(tool: Tool, name: &str, option: &str) -> bool {
    let whole = || {
        is_long_option(tool, name)
            || SLURM_OPTIONS.iter().any(|o| o.name == name)
            || SBATCH_ACTIONS.iter().any(|(o, _)| *o == name)
    };
    option == name || (option.starts_with(name) && !whole())
}

/// The first option sweep gives `tool` in `spec`'s jobs that one of `names` sets, and how.
fn owned(tool: Tool, names: &[String], spec: &SlurmSpec) -> Option<(&'static SlurmOption, String)> {
    names.iter().find_map(|name| {
        let mut set = SLURM_OPTIONS
            .iter()
            .filter(|o| o.set_by_sweep(tool, spec) && reads_as(tool, name, o.name));
        let option = set.next()?;
        let sets = match (option.name == name, set.next()) {
            (true, _) => format!("sets `--{}`", option.name),
            (false, None) => format!("abbreviates `--{}`", option.name),
            (false, Some(other)) => {
                format!("abbreviates `--{}` or `--{}`", option.name, other.name)
            }
        };
        Some((option, sets))
    })
}

/// What to do instead of setting `option`.
fn instead(option: &SlurmOption) -> String {
    match (option.key, option.name) {
        (Some(key), _) => format!("set `{key}` in [slurm] (or sweep `slurm.{key}`) instead"),
        (None, "output" | "error") => "leave it out: a run's lines, stderr too, stay in its job log, which the report, the live view and the watchdog read (and whose end the report quotes when a run fails)".into(),
        (None, _) => "sweep writes it itself: leave it out".into(),
    }
}

/// Why an `extra_sbatch` entry cannot be `#SBATCH <entry>` in a job of `spec` (no option, or
/// one sweep sets), and what to write instead.
pub fn sbatch_line_fault(line: &str, spec: &SlurmSpec) -> Option<(String, String)> {
    if !line.trim_start().starts_with('-') {
        return Some((
            format!("`{line}` is not an sbatch option"),
            "each entry is written as `#SBATCH <entry>`: give options such as `--exclusive` or `--gres=gpu:4`".into(),
        ));
    }
    // Every option of the line, as sbatch reads it: `-vo x` sets the output.
    let names = match options(Tool::Sbatch, line) {
        Ok(names) => names,
        Err(why) => {
            return Some((
                why,
                "give sbatch's options as `man sbatch` spells them".into(),
            ))
        }
    };
    let action = names.iter().find_map(|name| {
        SBATCH_ACTIONS
            .iter()
            .find(|(o, _)| reads_as(Tool::Sbatch, name, o))
    });
    if let Some((option, does)) = action {
        return Some((
            format!("`{line}` (`--{option}`) {does}"),
            "leave it out: it is sbatch's option, not the job's".into(),
        ));
    }
    let (option, sets) = owned(Tool::Sbatch, &names, spec)?;
    Some((
        format!("`{line}` {sets}, which sweep's job scripts already set (a later `#SBATCH` line would override theirs)"),
        instead(option),
    ))
}

/// Why a `srun_args` entry cannot be given to the run's srun (it sets what sweep's launch line
/// sets, or moves the output), and what to do instead.
pub fn srun_arg_fault(arg: &str, spec: &SlurmSpec) -> Option<(String, String)> {
    let names = match options(Tool::Srun, arg) {
        Ok(names) => names,
        Err(why) => return Some((why, "give srun's options as `man srun` spells them".into())),
    };
    let (option, sets) = owned(Tool::Srun, &names, spec)?;
    Some((
        format!("`{arg}` {sets}, which sweep gives the run's srun itself (the later argument would override it)"),
        instead(option),
    ))
}

/// The first `srun_args` entry where srun's options end: srun would run it as the program.
/// Its index, why, and what to do.
pub fn srun_program_fault(args: &[String]) -> Option<(usize, String, String)> {
    let at = first_operand(Tool::Srun, args)?;
    let why = match args[at].as_str() {
        "--" => "`--` ends srun's options: srun would run what follows as the program, not the run's command".to_string(),
        word => format!("`{word}` is no srun option nor an option's value: srun would run it as the program, not the run's command"),
    };
    Some((
        at,
        why,
        "give options only (`--mpi=pmi2`); a program to wrap the run's goes in `command`".into(),
    ))
}

/// The variables a launcher gives every process; a run without one sees none of them.
pub const RANK_VARIABLES: [&str; 7] = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
];

/// The job's own variables (`_prologue.sh.j2`): a study's would send its log elsewhere.
const SCRIPT_VARIABLES: [&str; 4] = ["RUN_DIR", "JOB_REF", "SWEEP_RUN_DIR", "SWEEP_RESTART_COUNT"];

/// Why `[slurm] env` may not set `name`, and what to do instead.
pub fn env_fault(name: &str) -> Option<(String, String)> {
    if SCRIPT_VARIABLES.contains(&name) {
        return Some((
            format!("`{name}` is a variable of sweep's job script (the run's directory, job and restarts, by which its log, exit status and records are found): set here, it would send them elsewhere"),
            match name {
                "SWEEP_RUN_DIR" | "SWEEP_RESTART_COUNT" => "leave it out: sweep sets it for each run",
                _ => "name your variable otherwise; a program finds its run's directory in `SWEEP_RUN_DIR`",
            }
            .into(),
        ));
    }
    if !RANK_VARIABLES.contains(&name) {
        return None;
    }
    let help = match name {
        "MASTER_PORT" => "set `master_port` in [slurm] instead",
        "WORLD_SIZE" | "LOCAL_WORLD_SIZE" => "set `nodes` and `ntasks_per_node` in [slurm] instead",
        _ => "leave it out: docs/manifest.md, \"The variables a command sees\", says what each process gets",
    };
    Some((
        format!("`{name}` is set by the run's launcher for each process it starts (and unset without one): this value would never reach the program"),
        help.into(),
    ))
}

/// The key at fault and why, where `extra_sbatch` or `srun_args` sets what sweep's scripts set.
pub fn check(spec: &SlurmSpec) -> Result<(), (&'static str, String)> {
    let sbatch = spec
        .extra_sbatch
        .iter()
        .find_map(|l| sbatch_line_fault(l, spec))
        .map(|f| ("extra_sbatch", f));
    let srun = || {
        spec.srun_args
            .iter()
            .find_map(|a| srun_arg_fault(a, spec))
            .or_else(|| srun_program_fault(&spec.srun_args).map(|(_, why, help)| (why, help)))
            .map(|f| ("srun_args", f))
    };
    match sbatch.or_else(srun) {
        Some((key, (why, help))) => Err((key, format!("{why}: {help}"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_sbatch_may_not_set_what_the_job_scripts_set() {
        let plain = SlurmSpec::default();
        let fault = |line: &str, spec: &SlurmSpec| sbatch_line_fault(line, spec).map(|f| f.0);
        let named = |line: &str, spec: &SlurmSpec, option: &str| {
            let why = fault(line, spec).unwrap_or_default();
            assert!(why.contains(&format!("sets `--{option}`")), "{line}: {why}");
        };
        // Always written: by full name (with `=` or a space) or short form.
        named("--output=/scratch/%j.out", &plain, "output");
        named("  --time 02:00:00", &plain, "time");
        named("-t02:00:00", &plain, "time");
        named("-o log", &plain, "output");
        named("--error=err.log", &plain, "error");
        named("-n 8", &plain, "ntasks");
        named("--array=0-9", &plain, "array");
        named("--no-requeue", &plain, "no-requeue");
        // sbatch's abbreviations of them, but not options of their own.
        // (`--outp` and `--part` as sbatch 22.05 reads them on the local
        // cluster, after the whole name; `--ntask` it refuses as ambiguous.)
        let why = fault("--outp=/scratch/%j.out", &plain).unwrap();
        assert!(why.contains("abbreviates `--output`"), "{why}");
        let why = fault("--ntask=4", &plain).unwrap();
        assert!(why.contains("`--ntasks-per-node` or `--ntasks`"), "{why}");
        // Others, only where [slurm] has sweep write them.
        for line in [
            "--partition=debug",
            "-p debug",
            "--gpus-per-node=4",
            "--signal=USR2@60",
        ] {
            assert_eq!(fault(line, &plain), None, "{line}");
        }
        let set = SlurmSpec {
            partition: Some("normal".into()),
            gpus_per_node: 4,
            signal_grace: Some(120),
            ..SlurmSpec::default()
        };
        named("-p debug", &set, "partition");
        named("--gpus-per-node=2", &set, "gpus-per-node");
        named("--signal=USR2@60", &set, "signal");
        let why = fault("--part=debug", &set).unwrap();
        assert!(why.contains("abbreviates `--partition`"), "{why}");
        assert_eq!(fault("--gpus=2", &set), None, "an option of its own");
        let (_, help) = sbatch_line_fault("--partition=debug", &set).unwrap();
        assert!(help.contains("set `partition` in [slurm]"), "{help}");
        // Options sweep leaves alone, and names that merely begin alike.
        for line in [
            "--exclusive",
            "--gres=gpu:4",
            "--gpus=4",
            "--mem-per-cpu=4G",
            "--time-min=10",
            "-G 4",
            "--comment='#SBATCH -o x'",
        ] {
            assert_eq!(fault(line, &set), None, "{line}");
        }
        assert!(fault("exclusive", &plain)
            .unwrap()
            .contains("is not an sbatch option"));
        // What would keep `sweep submit` waiting, or queue nothing.
        for (line, does) in [
            ("--wait", "wait for the job to end"),
            ("-W", "wait for the job to end"),
            ("--test-only", "no job is queued"),
            ("--test", "no job is queued"),
            ("--usage", "no job is queued"),
            ("-V", "no job is queued"),
        ] {
            let why = fault(line, &plain).unwrap_or_default();
            assert!(why.contains(does), "{line}: {why}");
        }
        assert_eq!(fault("--wait-all-nodes=1", &plain), None);
        // Every option of an entry, as sbatch reads a line: clusters of
        // one-letter options, several options, values glued on or apart.
        for (line, option) in [
            ("-vo /elsewhere/%j.out", "sets `--output`"),
            ("--exclusive --time=00:05:00", "sets `--time`"),
            ("--comment=x --array=0-3", "sets `--array`"),
            ("--comment x -t 5", "sets `--time`"),
            ("-vW", "wait for the job to end"),
            ("--exclusive -Qt5", "sets `--time`"),
        ] {
            let why = fault(line, &plain).unwrap_or_default();
            assert!(why.contains(option), "{line}: {why}");
        }
        for line in [
            "--comment='-t 5 -o x'",
            "--nice -5",
            "--mem-per-cpu 4G --exclusive",
        ] {
            assert_eq!(fault(line, &plain), None, "{line}");
        }
        let why = fault("-Y", &plain).unwrap();
        assert!(why.contains("no option of sbatch"), "{why}");
        // One rule for [slurm] and for every run's (an axis's) [slurm].
        let swept = SlurmSpec {
            extra_sbatch: vec!["--exclusive".into(), "-J mine".into()],
            ..SlurmSpec::default()
        };
        let (key, why) = check(&swept).unwrap_err();
        assert_eq!(key, "extra_sbatch");
        assert!(
            why.contains("sets `--job-name`") && why.contains("set `job_name`"),
            "{why}"
        );
    }

    #[test]
    fn srun_args_may_not_set_the_runs_ranks_or_move_its_output() {
        let plain = SlurmSpec::default();
        let fault = |arg: &str, spec: &SlurmSpec| srun_arg_fault(arg, spec).map(|f| f.0);
        for (arg, option) in [
            ("--ntasks=8", "sets `--ntasks`"),
            ("-n8", "sets `--ntasks`"),
            ("-N 2", "sets `--nodes`"),
            ("--output=/scratch/%t.out", "sets `--output`"),
            ("-o", "sets `--output`"),
            ("--err=e.log", "abbreviates `--error`"),
            ("-lN2", "sets `--nodes`"),
            ("-lo/elsewhere/%t.out", "sets `--output`"),
            ("--label --ntasks 4", "sets `--ntasks`"),
        ] {
            let why = fault(arg, &plain).unwrap_or_default();
            assert!(why.contains(option), "{arg}: {why}");
        }
        // A run's own srun options, and what only a packed run's line sets.
        for arg in [
            "--label",
            "--mpi=pmi2",
            "--cpu-bind=cores",
            "--kill-on-bad-exit=0",
            "--gpus-per-task=1",
            "--time=10",
            "--relative=1",
            "--exclusive",
        ] {
            assert_eq!(fault(arg, &plain), None, "{arg}");
        }
        let packed = SlurmSpec {
            pack: true,
            gpus_per_node: 4,
            ..SlurmSpec::default()
        };
        let why = fault("--time=10", &packed).unwrap();
        assert!(why.contains("sets `--time`"), "{why}");
        let (_, help) = srun_arg_fault("--gpus-per-node=1", &packed).unwrap();
        assert!(help.contains("set `gpus_per_node` in [slurm]"), "{help}");
        let (_, help) = srun_arg_fault("--output=x", &plain).unwrap();
        assert!(help.contains("stay in its job log"), "{help}");
        let spec = SlurmSpec {
            srun_args: vec!["--label".into(), "--ntasks-per-node=2".into()],
            ..SlurmSpec::default()
        };
        let (key, why) = check(&spec).unwrap_err();
        assert_eq!(key, "srun_args");
        assert!(why.contains("set `ntasks_per_node`"), "{why}");
    }

    #[test]
    fn env_may_not_set_the_scripts_variables_or_the_launchers() {
        for name in SCRIPT_VARIABLES {
            let (why, help) = env_fault(name).unwrap();
            assert!(why.contains("variable of sweep's job script"), "{why}");
            assert!(
                help.contains("SWEEP_RUN_DIR") || help.contains("sweep sets it"),
                "{help}"
            );
        }
        for name in RANK_VARIABLES {
            let (why, _) = env_fault(name).unwrap();
            assert!(why.contains("never reach the program"), "{why}");
        }
        let (_, help) = env_fault("MASTER_PORT").unwrap();
        assert!(help.contains("`master_port`"), "{help}");
        // A program's own, sweep's knobs, and names that merely begin alike.
        for name in [
            "OMP_NUM_THREADS",
            "PYTHONUNBUFFERED",
            "NCCL_DEBUG",
            "SWEEP_CPU_KERNELS",
            "RUN_DIRS",
            "RANKS",
            "run_dir",
        ] {
            assert_eq!(env_fault(name), None, "{name}");
        }
    }
}
