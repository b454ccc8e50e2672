//! Packed blocks (`[slurm] pack = true`): each block of a blocked design as one SLURM job sized
//! for its largest run, asking the sum of its runs' times plus a margin, its runs as job steps;
//! and what packing costs against a job per run (`sweep plan`).

use super::{Plan, Run};
use crate::manifest::slurm_options::{InBlock, SLURM_OPTIONS};
use crate::manifest::{Diagnostics, Manifest, SlurmSpec};

/// What a packed block asks beyond its runs' time: at least five minutes or a tenth of the sum.
pub fn margin_s(sum_s: u64) -> u64 {
    (sum_s / 10).max(MIN_MARGIN_S)
}

/// The least margin of a packed block (seconds).
pub const MIN_MARGIN_S: u64 = 300;

/// A packed block's allocation: every count its largest run asks, the time their sum + margin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub nodes: u32,
    pub ntasks_per_node: u32,
    pub gpus_per_node: u32,
    pub cpus_per_task: Option<u32>,
    /// The largest `mem` of its runs, as written (`None`: none asks).
    pub mem: Option<String>,
    /// The runs' time limits summed, and [`margin_s`] of it.
    pub time_s: u64,
    pub margin_s: u64,
}

impl Allocation {
    /// The allocation for runs with these `[slurm]` settings; `None` for none.
    pub fn of<'a>(specs: impl IntoIterator<Item = &'a SlurmSpec>) -> Option<Allocation> {
        let mut a: Option<Allocation> = None;
        let mut sum_s: u64 = 0;
        for s in specs {
            sum_s = sum_s.saturating_add(s.time.seconds());
            let b = a.get_or_insert(Allocation {
                nodes: 1,
                ntasks_per_node: 1,
                gpus_per_node: 0,
                cpus_per_task: None,
                mem: None,
                time_s: 0,
                margin_s: 0,
            });
            b.nodes = b.nodes.max(s.nodes.get());
            b.ntasks_per_node = b.ntasks_per_node.max(s.ntasks_per_node.get());
            b.gpus_per_node = b.gpus_per_node.max(s.gpus_per_node);
            b.cpus_per_task = b.cpus_per_task.max(s.cpus_per_task);
            if let Some(m) = &s.mem {
                let larger = match &b.mem {
                    // Checked at plan time: every `mem` of a packed study reads.
                    Some(cur) => mem_mb(m).unwrap_or(0) > mem_mb(cur).unwrap_or(0),
                    None => true,
                };
                if larger {
                    b.mem = Some(m.clone());
                }
            }
        }
        a.map(|a| Allocation {
            time_s: sum_s.saturating_add(margin_s(sum_s)),
            margin_s: margin_s(sum_s),
            ..a
        })
    }

    /// The `#SBATCH` lines of the allocation (its options of [`SLURM_OPTIONS`]).
    pub fn sbatch_lines(&self) -> Vec<String> {
        let mut lines = vec![
            format!("#SBATCH --time={}", slurm_time(self.time_s)),
            format!("#SBATCH --nodes={}", self.nodes),
            format!("#SBATCH --ntasks-per-node={}", self.ntasks_per_node),
        ];
        if self.gpus_per_node > 0 {
            lines.push(format!("#SBATCH --gpus-per-node={}", self.gpus_per_node));
        }
        if let Some(c) = self.cpus_per_task {
            lines.push(format!("#SBATCH --cpus-per-task={c}"));
        }
        if let Some(m) = &self.mem {
            lines.push(format!("#SBATCH --mem={m}"));
        }
        lines
    }
}

/// A block's job header: its runs' shared `#SBATCH` lines with the allocation's sizes and time
/// (and no log: the block's script names its own).
pub fn block_header(run_header: &[String], allocation: &Allocation) -> Vec<String> {
    let replaced = |line: &str| {
        let rest = line.trim_start_matches("#SBATCH");
        let names = crate::util::slurm::options(crate::util::slurm::Tool::Sbatch, rest);
        names.unwrap_or_default().iter().any(|n| {
            SLURM_OPTIONS
                .iter()
                .any(|o| o.name == n && o.in_block != InBlock::Shared)
        })
    };
    let mut lines: Vec<String> = run_header
        .iter()
        .filter(|l| !replaced(l))
        .cloned()
        .collect();
    lines.extend(allocation.sbatch_lines());
    lines
}

/// `D-HH:MM:SS`, as sbatch reads it.
pub fn slurm_time(s: u64) -> String {
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    format!("{d}-{h:02}:{m:02}:{s:02}")
}

/// `--mem` in MB: a whole number with unit K, M (default), G or T; `0` (all) is the largest.
pub fn mem_mb(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let n: u64 = s[..digits].parse().ok()?;
    let per: u64 = match s[digits..].to_ascii_uppercase().as_str() {
        "" | "M" | "MB" => 1,
        "K" | "KB" => return Some(n.div_ceil(1024)),
        "G" | "GB" => 1024,
        "T" | "TB" => 1024 * 1024,
        _ => return None,
    };
    if n == 0 {
        return Some(u64::MAX);
    }
    n.checked_mul(per)
}

/// One packed block: its number, its runs in block order, and its allocation.
#[derive(Debug, Clone)]
pub struct PackedBlock {
    pub block: u32,
    pub runs: Vec<usize>,
    pub allocation: Allocation,
}

/// The plan's blocks, in order (none for an interleaved design).
pub fn blocks(plan: &Plan) -> Vec<PackedBlock> {
    let mut members: Vec<(u32, Vec<usize>)> = Vec::new();
    for (i, r) in plan.runs.iter().enumerate() {
        let Some(b) = r.block else { continue };
        match members.last_mut() {
            Some((n, runs)) if *n == b.block => runs.push(i),
            _ => members.push((b.block, vec![i])),
        }
    }
    members
        .into_iter()
        .map(|(block, runs)| PackedBlock {
            block,
            allocation: Allocation::of(runs.iter().map(|&i| &plan.runs[i].slurm))
                .expect("a block has runs"),
            runs,
        })
        .collect()
}

/// The `[slurm]` keys runs packed into one job must share.
fn shared_keys() -> Vec<&'static str> {
    let mut keys: Vec<&str> = Vec::new();
    let shared = SLURM_OPTIONS
        .iter()
        .filter(|o| o.in_block == InBlock::Shared);
    // `requeue` is two options' key (`--requeue`, `--no-requeue`).
    for key in shared.filter_map(|o| o.key).chain(["extra_sbatch"]) {
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys
}

/// A packed study's runs: each block's share [`shared_keys`], and every `mem` reads.
pub(super) fn check(m: &Manifest, runs: &[Run]) -> Result<(), Diagnostics> {
    if !m.slurm.pack {
        return Ok(());
    }
    for r in runs {
        if let Some(mem) = &r.slurm.mem {
            if mem_mb(mem).is_none() {
                let d = m.locate("slurm.mem");
                return Err(crate::manifest::Diagnostic {
                    message: format!("run `{}`: `mem = \"{mem}\"` is not a size sbatch reads (a whole number and K, M, G or T)", r.name),
                    help: Some("a packed block asks for its largest run's memory: every `mem` must be comparable".into()),
                    ..d
                }
                .into());
            }
        }
    }
    // Each run's shared keys, serialised once; a block's first run's stand for it.
    let keys = shared_keys();
    let shared = |s: &SlurmSpec| -> Vec<serde_json::Value> {
        let v = serde_json::to_value(s).unwrap_or_default();
        keys.iter()
            .map(|k| v.get(*k).cloned().unwrap_or_default())
            .collect()
    };
    let mut first: std::collections::HashMap<u32, (&Run, Vec<serde_json::Value>)> =
        Default::default();
    for r in runs {
        let Some(b) = r.block else { continue };
        let mine = shared(&r.slurm);
        let (head, theirs) = first.entry(b.block).or_insert_with(|| (r, mine.clone()));
        let Some(k) = (0..keys.len()).find(|&k| mine[k] != theirs[k]) else {
            continue;
        };
        let key = keys[k];
        let d = m.locate(&format!("slurm.{key}"));
        return Err(crate::manifest::Diagnostic {
            message: format!(
                "block {}: runs `{}` and `{}` differ in `slurm.{key}` ({} and {}), and a packed block is one job",
                b.block, head.name, r.name, theirs[k], mine[k]
            ),
            help: Some(format!(
                "sweep `slurm.{key}` only without `pack`, or make it the same for every run"
            )),
            ..d
        }
        .into());
    }
    Ok(())
}

/// Every packed block within the partition's time limit (`None`: unlimited), or why not.
pub fn check_limit(plan: &Plan, partition: &str, limit_s: Option<u64>) -> Result<(), String> {
    let Some(limit) = limit_s else { return Ok(()) };
    let over: Vec<PackedBlock> = blocks(plan)
        .into_iter()
        .filter(|b| b.allocation.time_s > limit)
        .collect();
    let Some(first) = over.first() else {
        return Ok(());
    };
    Err(format!(
        "{} packed block(s) ask for more time than partition `{partition}` allows ({}): block {} asks for {} \
         (its {} runs' time limits and a margin of {}). Lower the runs' `time`, use a partition with a longer limit, \
         or set `pack = false` (a job per run)",
        over.len(),
        slurm_time(limit),
        first.block,
        slurm_time(first.allocation.time_s),
        first.runs.len(),
        slurm_time(first.allocation.margin_s),
    ))
}

/// Jobs at their time limits: how many, and their node- and GPU-hours.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Load {
    /// Jobs the scheduler starts (array tasks one by one): each waits and pays its start.
    pub jobs: usize,
    pub node_hours: f64,
    pub gpu_hours: f64,
}

impl Load {
    fn add(&mut self, nodes: u32, gpus_per_node: u32, seconds: u64) {
        let h = seconds as f64 / 3600.0;
        self.jobs += 1;
        self.node_hours += f64::from(nodes) * h;
        self.gpu_hours += f64::from(nodes) * f64::from(gpus_per_node) * h;
    }
}

/// The plan's jobs with a job per run or per block; stages are jobs in both.
pub fn load(plan: &Plan, packed: bool) -> Load {
    let mut l = Load::default();
    let mut add = |s: &SlurmSpec| l.add(s.nodes.get(), s.gpus_per_node, s.time.seconds());
    plan.stages.iter().for_each(|st| add(&st.slurm));
    match packed {
        false => plan.runs.iter().for_each(|r| add(&r.slurm)),
        true => {
            for b in blocks(plan) {
                let a = &b.allocation;
                l.add(a.nodes, a.gpus_per_node, a.time_s);
            }
        }
    }
    l
}

/// What a way of submitting the plan costs the queue.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Cost {
    pub load: Load,
    /// `sbatch` calls.
    pub submissions: usize,
}

/// The plan's cost with a job per run and with packed blocks.
pub fn costs(plan: &Plan) -> (Cost, Cost) {
    // Runs go out as one array per header and throttle (the executor's rule).
    let arrays: std::collections::HashSet<String> = plan
        .runs
        .iter()
        .map(|r| {
            let mut key = serde_json::to_value(&r.slurm).unwrap_or_default();
            if let Some(o) = key.as_object_mut() {
                for k in ["env", "setup", "srun_args", "template", "master_port"] {
                    o.remove(k);
                }
            }
            key.to_string()
        })
        .collect();
    let packed = load(plan, true);
    (
        Cost {
            load: load(plan, false),
            submissions: arrays.len() + plan.stages.len(),
        },
        Cost {
            load: packed,
            // A block is one sbatch call, as a stage is.
            submissions: packed.jobs,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(nodes: u32, tasks: u32, gpus: u32, time: &str, mem: Option<&str>) -> SlurmSpec {
        SlurmSpec {
            nodes: std::num::NonZeroU32::new(nodes).unwrap(),
            ntasks_per_node: std::num::NonZeroU32::new(tasks).unwrap(),
            gpus_per_node: gpus,
            time: crate::manifest::SlurmTime::parse(time).unwrap(),
            mem: mem.map(str::to_string),
            ..SlurmSpec::default()
        }
    }

    #[test]
    fn a_block_asks_for_its_largest_run_and_the_sum_of_their_times() {
        let a = Allocation::of(&[
            spec(1, 4, 4, "30", Some("64G")),
            spec(2, 1, 1, "1:00:00", Some("100000")),
            spec(1, 1, 0, "10", None),
        ])
        .unwrap();
        assert_eq!((a.nodes, a.ntasks_per_node, a.gpus_per_node), (2, 4, 4));
        assert_eq!(a.mem.as_deref(), Some("100000"), "100000 MB > 64 GB");
        // 100 minutes and the least margin (10 minutes is a tenth).
        assert_eq!(a.time_s, 6000 + 600);
        assert_eq!(slurm_time(a.time_s), "0-01:50:00");
        assert_eq!(Allocation::of(&[]), None);
        let short = Allocation::of(&[spec(1, 1, 0, "1", None)]).unwrap();
        assert_eq!(short.time_s, 60 + MIN_MARGIN_S);
    }

    #[test]
    fn memory_sizes_compare_as_sbatch_reads_them() {
        assert_eq!(mem_mb("512"), Some(512));
        assert_eq!(mem_mb("2G"), Some(2048));
        assert_eq!(mem_mb("1t"), Some(1 << 20));
        assert_eq!(mem_mb("2048K"), Some(2));
        assert_eq!(mem_mb("0"), Some(u64::MAX), "all of a node's memory");
        for bad in ["", "G", "1.5G", "-1", "1X", "99999999999999999999"] {
            assert_eq!(mem_mb(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_block_header_keeps_what_runs_share_and_takes_the_allocations_sizes() {
        let run: Vec<String> = [
            "#SBATCH --job-name=s",
            "#SBATCH --output=/r/a/%x-%j.out",
            "#SBATCH --time=00:30:00",
            "#SBATCH --nodes=1",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --partition=gpu",
            "#SBATCH --exclusive",
        ]
        .map(String::from)
        .to_vec();
        let a = Allocation::of(&[spec(2, 4, 4, "30", None)]).unwrap();
        assert_eq!(
            block_header(&run, &a),
            [
                "#SBATCH --job-name=s",
                "#SBATCH --partition=gpu",
                "#SBATCH --exclusive",
                "#SBATCH --time=0-00:35:00",
                "#SBATCH --nodes=2",
                "#SBATCH --ntasks-per-node=4",
                "#SBATCH --gpus-per-node=4",
            ]
        );
    }
}
