//! What a run ran on: `environment.json`, written by the job itself as it starts (`sweep
//! fingerprint`), so a crashed supervisor loses nothing. The history records it beside the
//! figures; `sweep check` says what changed between a slowed run and its reference.

use crate::layout::ENVIRONMENT_JSON;
use crate::manifest::EnvironmentSpec;
use crate::plan::record::RunRecord;
use crate::util::process::{output_within, Bounded};
use anyhow::{Context, Result};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// How long one probe (or `nvidia-smi`, `scontrol`, `mpirun`) may take.
const PROBE_LIMIT: Duration = Duration::from_secs(60);
/// What is kept of a probe's output.
const PROBE_BYTES: usize = 2000;
/// The largest `environment.json` read.
const MAX_BYTES: u64 = 4 << 20;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub name: String,
    pub uuid: String,
}

/// The build of sweep that ran the job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Build {
    pub version: String,
    pub features: Vec<String>,
    /// The project's commit when the run was rendered (`run.json`).
    pub commit: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Fingerprint {
    /// When the job took it (RFC 3339, UTC): when the run ran.
    pub taken_at: String,
    /// What the history groups by: `[environment] system`, else `<cluster>/<partition>`, else
    /// `local/<host>`.
    pub system: String,
    /// The host the job's script ran on (its first node).
    pub host: String,
    /// Every node of the allocation (`scontrol show hostnames`), else the host.
    pub nodes: Vec<String>,
    /// `<job id>` or `<array job>_<task>`; none outside SLURM.
    pub slurm_job: Option<String>,
    pub partition: Option<String>,
    /// The architecture sweep was built for (`x86_64`, `aarch64`: a GH200's).
    pub arch: String,
    pub cpu: Option<String>,
    /// The GPUs `nvidia-smi` lists on the host (none without one).
    pub gpus: Vec<Gpu>,
    pub driver: Option<String>,
    /// The CUDA version the driver supports (`nvidia-smi`).
    pub cuda: Option<String>,
    /// The MPI library on PATH (`mpirun --version`'s first line).
    pub mpi: Option<String>,
    /// The Linux kernel release.
    pub kernel: Option<String>,
    /// The GPU and MPI libraries this sweep loaded, by name, each the file the loader chose (its
    /// name carries the version). Other programs' libraries are a probe's to record.
    #[serde(default)]
    pub libraries: IndexMap<String, String>,
    pub sweep: Build,
    /// `[environment] probes`: name -> output (`exit N: output` failed, `timed out` hung).
    pub probes: IndexMap<String, String>,
    /// How busy the machine was as the job started, before its program ran.
    pub load_at_start: Option<Load>,
    /// ... and as it ended (`sweep fingerprint --end`): what else ran beside the run.
    pub load_at_end: Option<Load>,
}

/// How busy the host was without the run: what else ran beside it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// `/proc/loadavg`: over 1, 5 and 15 minutes.
    pub load_average: [f64; 3],
    /// Cores other processes kept busy over a quarter second, while the run's program is not running.
    pub busy_cores: f64,
    /// Cores of the host.
    pub cores: usize,
}

impl Load {
    /// Samples this host now (a quarter of a second); `None` off Linux.
    pub fn sample() -> Option<Load> {
        let busy = |text: &str| -> Option<(u64, u64)> {
            let line = text.lines().find(|l| l.starts_with("cpu "))?;
            let v: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
            let total: u64 = v.iter().take(8).sum();
            let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
            Some((total - idle, total))
        };
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let before = busy(&stat)?;
        // The host's cores, as the busy share is the whole host's.
        let cores = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .count();
        std::thread::sleep(Duration::from_millis(250));
        let after = busy(&std::fs::read_to_string("/proc/stat").ok()?)?;
        let (work, total) = (
            after.0.saturating_sub(before.0),
            after.1.saturating_sub(before.1),
        );
        let avg = std::fs::read_to_string("/proc/loadavg").ok()?;
        let mut avg = avg.split_whitespace().filter_map(|x| x.parse::<f64>().ok());
        Some(Load {
            load_average: [avg.next()?, avg.next()?, avg.next()?],
            busy_cores: match total {
                0 => 0.0,
                t => cores as f64 * work as f64 / t as f64,
            },
            cores,
        })
    }
}

impl Fingerprint {
    /// This machine's fingerprint: what `spec` asks to probe, and the rest found here.
    pub fn take(spec: &EnvironmentSpec, commit: Option<String>) -> Fingerprint {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let host = crate::util::process::host_name();
        let slurm_job = match (env("SLURM_ARRAY_JOB_ID"), env("SLURM_ARRAY_TASK_ID")) {
            (Some(a), Some(t)) => Some(format!("{a}_{t}")),
            _ => env("SLURM_JOB_ID"),
        };
        let partition = env("SLURM_JOB_PARTITION");
        let system =
            spec.system
                .clone()
                .unwrap_or_else(|| match (env("SLURM_CLUSTER_NAME"), &partition) {
                    (Some(c), Some(p)) => format!("{c}/{p}"),
                    (Some(c), None) => c,
                    (None, _) => format!("local/{host}"),
                });
        let nodes = env("SLURM_JOB_NODELIST")
            .and_then(|list| {
                let out = probe(Command::new("scontrol").args(["show", "hostnames", &list]))?;
                Some(out.lines().map(str::to_string).collect::<Vec<_>>())
            })
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| vec![host.clone()]);
        let (gpus, driver, cuda) = nvidia_smi();
        Fingerprint {
            taken_at: crate::util::now_rfc3339(),
            system,
            host,
            nodes,
            slurm_job,
            partition,
            arch: std::env::consts::ARCH.to_string(),
            cpu: crate::util::process::cpu_model(),
            gpus,
            driver,
            cuda,
            mpi: crate::util::process::find_in_path("mpirun")
                .and_then(|m| probe(Command::new(m).arg("--version")))
                .and_then(|v| v.lines().next().map(|l| l.trim().to_string())),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|k| k.trim().to_string()),
            libraries: std::fs::read_to_string("/proc/self/maps")
                .map(|m| libraries_in(&m))
                .unwrap_or_default(),
            sweep: Build {
                version: env!("CARGO_PKG_VERSION").to_string(),
                features: crate::config::Features::BUILT
                    .names()
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                commit,
            },
            probes: spec
                .probes
                .iter()
                .map(|(name, command)| (name.clone(), run_probe(command)))
                .collect(),
            load_at_start: Load::sample(),
            load_at_end: None,
        }
    }

    /// A run directory's `environment.json`: `None` where the job wrote none; an error naming the
    /// file where it cannot be read.
    pub fn load(dir: &Path) -> Result<Option<Fingerprint>> {
        use crate::util::fs::{read_regular, ReadError};
        let path = dir.join(ENVIRONMENT_JSON);
        match read_regular(&path, MAX_BYTES, Some(dir)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("{} is not an environment fingerprint", path.display())),
            Err(ReadError::NotFound) => Ok(None),
            Err(e) => Err(anyhow::anyhow!("{} {e}", path.display())),
        }
    }

    /// What a comparison tells fingerprints apart by: (label, value), one pair per value.
    fn facts(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        let mut one = |label: &str, v: &Option<String>| {
            if let Some(v) = v {
                out.push((label.to_string(), v.clone()));
            }
        };
        one("system", &Some(self.system.clone()));
        one("arch", &(!self.arch.is_empty()).then(|| self.arch.clone()));
        one("cpu", &self.cpu);
        one("driver", &self.driver);
        one("cuda", &self.cuda);
        one("mpi", &self.mpi);
        one("kernel", &self.kernel);
        one("sweep", &Some(self.sweep_text()));
        one("commit", &self.sweep.commit);
        for g in &self.gpus {
            out.push(("gpu".into(), g.name.clone()));
        }
        for (name, path) in &self.libraries {
            let file = path.rsplit('/').next().unwrap_or(path);
            out.push((name.clone(), file.to_string()));
        }
        for (name, value) in &self.probes {
            out.push((format!("probe {name}"), value.clone()));
        }
        out
    }

    fn sweep_text(&self) -> String {
        match self.sweep.features.is_empty() {
            true => self.sweep.version.clone(),
            false => format!(
                "{} ({})",
                self.sweep.version,
                self.sweep.features.join(", ")
            ),
        }
    }
}

/// Writes this machine's fingerprint into run directory `dir` atomically (probes from `run.json`).
pub fn write(dir: &Path) -> Result<Fingerprint> {
    let record = RunRecord::read(&dir.join(crate::layout::RUN_JSON), None)?;
    let (spec, commit) = match record {
        Some(r) => (r.environment.unwrap_or_default(), r.git_commit),
        None => (EnvironmentSpec::default(), None),
    };
    let f = Fingerprint::take(&spec, commit);
    let mut bytes = serde_json::to_vec_pretty(&f).expect("a fingerprint serialises");
    bytes.push(b'\n');
    crate::util::fs::write_atomic(&dir.join(ENVIRONMENT_JSON), &bytes)?;
    Ok(f)
}

/// Adds the host's load as the job ends to `environment.json`, where there is one.
pub fn write_end(dir: &Path) -> Result<Option<Load>> {
    let Some(mut f) = Fingerprint::load(dir)? else {
        return Ok(None);
    };
    f.load_at_end = Load::sample();
    let mut bytes = serde_json::to_vec_pretty(&f).expect("a fingerprint serialises");
    bytes.push(b'\n');
    crate::util::fs::write_atomic(&dir.join(ENVIRONMENT_JSON), &bytes)?;
    Ok(f.load_at_end)
}

/// A program's output when it succeeded in time; `None` otherwise.
fn probe(cmd: &mut Command) -> Option<String> {
    match output_within(cmd, PROBE_LIMIT, PROBE_BYTES * 100) {
        Ok(Bounded {
            text,
            code: Some(0),
            ..
        }) => Some(text),
        _ => None,
    }
}

/// A user's probe, through the shell: its output trimmed, or why it has none.
fn run_probe(command: &str) -> String {
    let out = output_within(
        Command::new("bash").args(["-c", command]),
        PROBE_LIMIT,
        PROBE_BYTES,
    );
    match out {
        Ok(b) if b.timed_out => format!("timed out after {} s", PROBE_LIMIT.as_secs()),
        Ok(b) => {
            let text = b.text.trim().to_string();
            match b.code {
                Some(0) => text,
                Some(c) => format!("exit {c}: {text}"),
                None => format!("killed by a signal: {text}"),
            }
        }
        Err(e) => format!("{e:#}"),
    }
}

/// The GPU and MPI libraries by the start of their file names (longer names first).
const LIBRARIES: &[&str] = &[
    "libcudart",
    "libcublasLt",
    "libcublas",
    "libnvrtc",
    "libcurand",
    "libcudnn",
    "libnccl",
    "libmpi",
];

/// The [`LIBRARIES`] a process has mapped (`/proc/<pid>/maps`), with their files' paths.
fn libraries_in(maps: &str) -> IndexMap<String, String> {
    let mut out = IndexMap::new();
    for line in maps.lines() {
        let Some(path) = line
            .split_whitespace()
            .nth(5)
            .filter(|p| p.starts_with('/'))
        else {
            continue;
        };
        let file = path.rsplit('/').next().unwrap_or(path);
        let known = LIBRARIES.iter().find(|l| {
            file.strip_prefix(**l)
                .is_some_and(|rest| rest.starts_with(".so"))
        });
        if let Some(name) = known {
            out.entry(name.to_string())
                .or_insert_with(|| path.to_string());
        }
    }
    out
}

/// The GPUs, driver and driver CUDA version `nvidia-smi` reports.
fn nvidia_smi() -> (Vec<Gpu>, Option<String>, Option<String>) {
    let Some(smi) = crate::util::process::find_in_path("nvidia-smi") else {
        return (Vec::new(), None, None);
    };
    let listed = probe(Command::new(&smi).args([
        "--query-gpu=name,uuid,driver_version",
        "--format=csv,noheader",
    ]));
    let mut gpus = Vec::new();
    let mut driver = None;
    for line in listed.as_deref().unwrap_or("").lines() {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if let [name, uuid, d] = f[..] {
            gpus.push(Gpu {
                name: name.to_string(),
                uuid: uuid.to_string(),
            });
            driver = Some(d.to_string());
        }
    }
    // The banner's "CUDA Version: 13.0".
    let cuda = probe(&mut Command::new(&smi)).and_then(|banner| {
        let at = banner.find("CUDA Version:")?;
        banner[at + "CUDA Version:".len()..]
            .split_whitespace()
            .next()
            .map(str::to_string)
    });
    (gpus, driver, cuda)
}

/// What differs between the fingerprints of runs now and their reference (`driver 580.65 →
/// 580.82`), as `sweep check` lists it beside a regression.
pub fn differences(now: &[&Fingerprint], before: &[&Fingerprint]) -> Vec<String> {
    if now.is_empty() || before.is_empty() {
        return Vec::new();
    }
    let values = |fs: &[&Fingerprint]| {
        let mut by: IndexMap<String, BTreeSet<String>> = IndexMap::new();
        for f in fs {
            for (label, v) in f.facts() {
                by.entry(label).or_default().insert(v);
            }
        }
        by
    };
    let (a, b) = (values(before), values(now));
    let mut labels: Vec<&String> = a.keys().collect();
    labels.extend(b.keys().filter(|k| !a.contains_key(*k)));
    let empty = BTreeSet::new();
    let join = |s: &BTreeSet<String>| match s.is_empty() {
        true => "(none)".to_string(),
        false => s.iter().cloned().collect::<Vec<_>>().join(", "),
    };
    let mut out = Vec::new();
    for label in labels {
        let (was, is) = (
            a.get(label).unwrap_or(&empty),
            b.get(label).unwrap_or(&empty),
        );
        if was != is {
            out.push(format!("{label} {} → {}", join(was), join(is)));
        }
    }
    let nodes = |fs: &[&Fingerprint]| -> BTreeSet<String> {
        fs.iter().flat_map(|f| f.nodes.iter().cloned()).collect()
    };
    let (was, is) = (nodes(before), nodes(now));
    let new: Vec<&String> = is.difference(&was).collect();
    const SHOWN: usize = 5;
    for n in new.iter().take(SHOWN) {
        out.push(format!("node {n} new in the list"));
    }
    if new.len() > SHOWN {
        out.push(format!("{} more new nodes", new.len() - SHOWN));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(driver: &str, nodes: &[&str]) -> Fingerprint {
        Fingerprint {
            system: "alps/normal".into(),
            driver: Some(driver.into()),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            sweep: Build {
                version: "0.1.0".into(),
                ..Build::default()
            },
            ..Fingerprint::default()
        }
    }

    #[test]
    fn differences_name_what_changed() {
        let before = [fp("580.65", &["nid001"]), fp("580.65", &["nid002"])];
        let now = [fp("580.82", &["nid001"]), fp("580.82", &["nid001234"])];
        let d = differences(
            &now.iter().collect::<Vec<_>>(),
            &before.iter().collect::<Vec<_>>(),
        );
        assert_eq!(
            d,
            vec![
                "driver 580.65 → 580.82".to_string(),
                "node nid001234 new in the list".to_string()
            ]
        );
        let same = differences(&[&before[0]], &[&before[0], &before[1]]);
        assert!(same.is_empty(), "{same:?}");
        assert!(differences(&[], &[&before[0]]).is_empty());
    }

    #[test]
    fn probes_are_bounded_and_say_why_they_failed() {
        assert_eq!(run_probe("echo 2.11.0"), "2.11.0");
        assert_eq!(run_probe("echo no >&2; exit 3"), "exit 3: no");
        // A flood is cut, and a child left running does not hold the probe.
        let long = run_probe("yes | head -c 100000; sleep 30 &");
        assert!(long.len() <= PROBE_BYTES, "{}", long.len());
    }

    #[test]
    fn the_libraries_loaded_are_named_with_their_files() {
        let maps = "\
7f1 r--p 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4
7f2 r-xp 00001000 08:01 1 /usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4
7f3 r--p 00000000 08:01 2 /opt/nvidia/lib/libcublasLt.so.13.0.2.14
7f4 r--p 00000000 08:01 3 /opt/nvidia/lib/libcublas.so.13.0.2.14
7f5 r--p 00000000 08:01 4 /opt/nccl/lib/libnccl.so.2.27.7
7f6 r--p 00000000 08:01 5 /usr/lib/libmpi_cxx.so.40.30.1
7f7 rw-p 00000000 00:00 0 [heap]
7f8 r--p 00000000 08:01 6 /usr/lib/libc.so.6
";
        let libs = libraries_in(maps);
        assert_eq!(
            libs.iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
            [
                ("libmpi", "/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4"),
                ("libcublasLt", "/opt/nvidia/lib/libcublasLt.so.13.0.2.14"),
                ("libcublas", "/opt/nvidia/lib/libcublas.so.13.0.2.14"),
                ("libnccl", "/opt/nccl/lib/libnccl.so.2.27.7"),
            ]
        );
        // A new NCCL shows as a difference.
        let mut a = fp("580.65", &["n1"]);
        let mut b = a.clone();
        a.libraries
            .insert("libnccl".into(), "/x/libnccl.so.2.21.5".into());
        b.libraries
            .insert("libnccl".into(), "/y/libnccl.so.2.27.7".into());
        assert_eq!(
            differences(&[&b], &[&a]),
            ["libnccl libnccl.so.2.21.5 → libnccl.so.2.27.7"]
        );
    }
}
