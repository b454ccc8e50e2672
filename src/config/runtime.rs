//! What the environment tunes in a `sweep` process, read once at start-up: how it computes,
//! never what a run is (kernels, the CUDA pool, extra checks, the job scripts' binary). A bad
//! value is an error naming the variable. candle's kernels read the installed copy
//! ([`RuntimeOptions::current`]); `docs/running.md`'s table is kept equal to [`VARIABLES`].

use anyhow::{bail, Result};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;
use strum::VariantArray;

/// Which CPU kernel multiplies bf16-mixed's operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuKernels {
    /// The best the CPU has (AMX, else AVX-512 BF16, where present).
    #[default]
    Auto,
    /// AMX where the CPU has it (as `auto`: the fastest).
    Amx,
    /// AVX-512 BF16 where the CPU has it, not AMX (to compare them).
    Avx512Bf16,
    /// The portable kernel whatever the CPU has (to test it, or to compare).
    Portable,
}

/// Which implementation ops with CUDA kernels use: `SWEEP_CUDA_KERNELS`, or a run's `kernels`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum CudaKernels {
    /// sweep's kernels that pass their self-check at device open and beat their composed twins at
    /// the run's shapes; the twin of any other (said, and recorded in the metrics).
    #[default]
    Auto,
    /// All of sweep's kernels: one failing its self-check stops the run.
    Own,
    /// The composed twins (candle's kernels): to measure, or to rule a kernel out.
    Composed,
}

impl CudaKernels {
    /// Its name in the variable, the manifest and messages.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// What the CUDA memory pool does with the memory the trainer frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CudaPool {
    /// Keeps it for the next allocation, as PyTorch's caching allocator does.
    #[default]
    Keep,
    /// Hands it back to the driver at every synchronisation: each step allocates afresh.
    Release,
}

/// Every environment variable a `sweep` process reads for itself, resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// `SWEEP_CPU_KERNELS`.
    pub cpu_kernels: CpuKernels,
    /// `SWEEP_CUDA_KERNELS`.
    pub cuda_kernels: CudaKernels,
    /// `SWEEP_CUDA_POOL`.
    pub cuda_pool: CudaPool,
    /// `SWEEP_CHECK_REPLICAS`: compare every rank's parameters after every step.
    pub check_replicas: bool,
    /// `SWEEP_BLOCKING_ALLREDUCE`: sum gradient buckets after the backward pass.
    pub blocking_allreduce: bool,
    /// `SWEEP_ENGINE_AT_ONE`: the data-parallel engine at world size 1, to measure its cost.
    pub engine_at_one: bool,
    /// `SWEEP_BIN`: the `sweep` job scripts run, instead of this binary.
    pub sweep_bin: Option<PathBuf>,
    /// `SWEEP_THREADS`, else `SLURM_CPUS_PER_TASK`: threads when a run says none.
    pub threads: Option<usize>,
}

/// One variable: its name, values (the first the default) and what it does.
pub struct Variable {
    pub name: &'static str,
    pub values: &'static str,
    pub what: &'static str,
}

/// The variables [`RuntimeOptions`] reads, in the docs' order.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "SWEEP_CPU_KERNELS",
        values: "`auto`, `amx`, `avx512-bf16`, `portable`",
        what: "the CPU's bf16 matrix kernel: the best the CPU has, or the named one where the CPU has it (else the best it has below that)",
    },
    Variable {
        name: "SWEEP_CUDA_KERNELS",
        values: "`auto`, `own`, `composed`",
        what: "sweep's CUDA kernels that pass their self-check when the device opens and are faster than their composed twins at the run's shapes (the twin of any other), all of them (a failure stops the run), or candle's composed ops in their place; a run's `kernels` key overrides it",
    },
    Variable {
        name: "SWEEP_CUDA_POOL",
        values: "`keep`, `release`",
        what: "the CUDA memory pool keeps freed memory, or hands it back at each synchronisation",
    },
    Variable {
        name: "SWEEP_CHECK_REPLICAS",
        values: "`0`, `1`",
        what: "compare every rank's parameters after every step, not only at the end",
    },
    Variable {
        name: "SWEEP_BLOCKING_ALLREDUCE",
        values: "`0`, `1`",
        what: "sum gradients after the backward pass instead of during it",
    },
    Variable {
        name: "SWEEP_ENGINE_AT_ONE",
        values: "`0`, `1`",
        what: "go through the data-parallel engine at world size 1 (what `sweep bench ddp --engine-at-one` sets)",
    },
    Variable {
        name: "SWEEP_BIN",
        values: "unset, a path",
        what: "the `sweep` that rendered job scripts run (e.g. the cluster's GPU build), instead of this binary",
    },
    Variable {
        name: "SWEEP_THREADS",
        values: "unset, 1 to 4096",
        what: "threads for CPU work when a run sets none (the local executor sets it); else `SLURM_CPUS_PER_TASK`, else every core",
    },
];

/// The options the process installed at start-up.
static INSTALLED: OnceLock<RuntimeOptions> = OnceLock::new();

impl RuntimeOptions {
    /// The options from this process's environment; a bad value is an error naming it.
    pub fn from_env() -> Result<RuntimeOptions> {
        Self::from_vars(|k| std::env::var_os(k))
    }

    /// The options from `get` (a variable's value, if set).
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<RuntimeOptions> {
        let word = |name: &str| -> Result<Option<String>> {
            match get(name) {
                None => Ok(None),
                Some(v) => match v.into_string() {
                    Ok(s) if s.is_empty() => Ok(None),
                    Ok(s) => Ok(Some(s)),
                    Err(v) => bail!("{name}={v:?} is not UTF-8: {}", takes(name)),
                },
            }
        };
        let choice = |name: &str, words: &[&str]| -> Result<usize> {
            match word(name)? {
                None => Ok(0),
                Some(w) => match words.iter().position(|&x| x == w) {
                    Some(i) => Ok(i),
                    None => bail!("{name}=`{}`: {}", w.escape_debug(), takes(name)),
                },
            }
        };
        let flag = |name: &str| -> Result<bool> {
            match word(name)?.as_deref() {
                None | Some("0" | "false" | "no" | "off") => Ok(false),
                Some("1" | "true" | "yes" | "on") => Ok(true),
                Some(w) => bail!("{name}=`{}`: {}", w.escape_debug(), takes(name)),
            }
        };
        let threads = match word("SWEEP_THREADS")? {
            Some(w) => match w.parse::<usize>() {
                Ok(n) if (1..=super::MAX_THREADS).contains(&n) => Some(n),
                _ => bail!(
                    "SWEEP_THREADS=`{}`: {}",
                    w.escape_debug(),
                    takes("SWEEP_THREADS")
                ),
            },
            // SLURM's own: whatever it says that is no count is not ours to refuse.
            None => word("SLURM_CPUS_PER_TASK")
                .ok()
                .flatten()
                .and_then(|w| w.parse::<usize>().ok())
                .filter(|&n| n > 0)
                .map(|n| n.min(super::MAX_THREADS)),
        };
        Ok(RuntimeOptions {
            cpu_kernels: [
                CpuKernels::Auto,
                CpuKernels::Amx,
                CpuKernels::Avx512Bf16,
                CpuKernels::Portable,
            ][choice(
                "SWEEP_CPU_KERNELS",
                &["auto", "amx", "avx512-bf16", "portable"],
            )?],
            cuda_kernels: CudaKernels::VARIANTS[choice(
                "SWEEP_CUDA_KERNELS",
                &CudaKernels::VARIANTS
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>(),
            )?],
            cuda_pool: [CudaPool::Keep, CudaPool::Release]
                [choice("SWEEP_CUDA_POOL", &["keep", "release"])?],
            check_replicas: flag("SWEEP_CHECK_REPLICAS")?,
            blocking_allreduce: flag("SWEEP_BLOCKING_ALLREDUCE")?,
            engine_at_one: flag("SWEEP_ENGINE_AT_ONE")?,
            sweep_bin: word("SWEEP_BIN")?.map(PathBuf::from),
            threads,
        })
    }

    /// Makes these the process's options (once; a second call changes nothing).
    pub fn install(self) -> &'static RuntimeOptions {
        INSTALLED.get_or_init(|| self)
    }

    /// The installed options; without any (a library user, a unit test) the environment's, a bad
    /// value counting as the default.
    pub fn current() -> &'static RuntimeOptions {
        INSTALLED.get_or_init(|| Self::from_env().unwrap_or_default())
    }

    /// Threads for CPU work: `configured` if positive, else [`RuntimeOptions::threads`], else every
    /// core; at most [`super::MAX_THREADS`].
    pub fn threads(&self, configured: usize) -> usize {
        match configured {
            0 => self.threads.unwrap_or_else(cores),
            n => n,
        }
        .min(super::MAX_THREADS)
    }
}

/// The cores this process may run on (1 where that cannot be told).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What variable `name` takes, for its error.
fn takes(name: &str) -> String {
    let v = VARIABLES.iter().find(|v| v.name == name);
    format!("it takes {} (docs/running.md)", v.map_or("", |v| v.values))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<RuntimeOptions> {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        RuntimeOptions::from_vars(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn unset_and_empty_are_the_defaults() {
        assert_eq!(from(&[]).unwrap(), RuntimeOptions::default());
        let empty: Vec<(&str, &str)> = VARIABLES.iter().map(|v| (v.name, "")).collect();
        assert_eq!(from(&empty).unwrap(), RuntimeOptions::default());
    }

    #[test]
    fn every_variable_is_read() {
        let o = from(&[
            ("SWEEP_CPU_KERNELS", "portable"),
            ("SWEEP_CUDA_KERNELS", "composed"),
            ("SWEEP_CUDA_POOL", "release"),
            ("SWEEP_CHECK_REPLICAS", "1"),
            ("SWEEP_BLOCKING_ALLREDUCE", "true"),
            ("SWEEP_ENGINE_AT_ONE", "yes"),
            ("SWEEP_BIN", "/opt/sweep"),
            ("SWEEP_THREADS", "3"),
            ("SLURM_CPUS_PER_TASK", "8"),
        ])
        .unwrap();
        assert_eq!(
            o,
            RuntimeOptions {
                cpu_kernels: CpuKernels::Portable,
                cuda_kernels: CudaKernels::Composed,
                cuda_pool: CudaPool::Release,
                check_replicas: true,
                blocking_allreduce: true,
                engine_at_one: true,
                sweep_bin: Some("/opt/sweep".into()),
                threads: Some(3),
            }
        );
        assert_eq!(o.threads(0), 3);
        assert_eq!(o.threads(5), 5);
        let slurm = from(&[("SLURM_CPUS_PER_TASK", "8")]).unwrap();
        assert_eq!(slurm.threads(0), 8);
        // SLURM's variable is not ours to refuse.
        assert_eq!(from(&[("SLURM_CPUS_PER_TASK", "x")]).unwrap().threads, None);
    }

    #[test]
    fn a_bad_value_names_the_variable_and_what_it_takes() {
        for (name, value, takes) in [
            (
                "SWEEP_CPU_KERNELS",
                "avx9",
                "`auto`, `amx`, `avx512-bf16`, `portable`",
            ),
            ("SWEEP_CUDA_KERNELS", "Own", "`own`, `composed`"),
            ("SWEEP_CUDA_POOL", "release\n", "`keep`, `release`"),
            ("SWEEP_CHECK_REPLICAS", "2", "`0`, `1`"),
            ("SWEEP_BLOCKING_ALLREDUCE", "maybe", "`0`, `1`"),
            ("SWEEP_ENGINE_AT_ONE", "-1", "`0`, `1`"),
            ("SWEEP_THREADS", "0", "1 to 4096"),
            ("SWEEP_THREADS", "99999999999999999999999", "1 to 4096"),
        ] {
            let e = from(&[(name, value)]).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{name}=`{}`", value.escape_debug())) && e.contains(takes),
                "{e}"
            );
        }
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0xff]);
        let e = RuntimeOptions::from_vars(|k| (k == "SWEEP_BIN").then(|| bad.clone()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SWEEP_BIN") && e.contains("not UTF-8"), "{e}");
    }

    #[test]
    fn the_docs_table_lists_every_variable() {
        let docs = include_str!("../../docs/running.md");
        for v in VARIABLES {
            let row = format!("| `{}` | {} | {} |", v.name, v.values, v.what);
            assert!(docs.contains(&row), "docs/running.md lacks the row\n{row}");
        }
    }
}
