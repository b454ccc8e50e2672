//! The largest batch a configuration trains at, by real steps (`sweep bench max-batch`, and
//! `batch_size = "max"`): each trial is `sweep train` in a child with another `batch_size`; out of
//! device memory or over the resident-memory budget means too large. The search starts at the
//! plan's estimate, doubles until a failure, then bisects; every trial's tokens/s comes back.

use crate::config::{BatchSize, DeviceKind, TrainConfig};
use crate::estimate::memory;
use crate::train::run::record::{parse_log, METRICS_FILE};
use crate::util::process::{forget_child, proc_kb, spawn_stoppable};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The trainer's `peak_memory_mb` counts 2^20 bytes; so does this table.
pub const MB: f64 = (1 << 20) as f64;

pub struct SearchOptions {
    /// A run's `config.toml` (what `sweep render` writes).
    pub config: PathBuf,
    /// Resident memory a trial may use (CPU; default 80% of what is free).
    pub memory_limit: Option<u64>,
    /// Training steps per trial (the first is not timed).
    pub steps: usize,
    /// The largest batch size to try.
    pub max: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Trains { tokens_per_s: f64, peak_mb: f64 },
    OutOfMemory(String),
}

#[derive(Debug, Clone)]
pub struct Trial {
    pub batch: usize,
    pub outcome: Outcome,
    /// The plan's estimate for this batch size, MB.
    pub estimate_mb: Option<f64>,
}

pub struct Search {
    pub trials: Vec<Trial>,
    /// The largest batch that trained (None: not even batch 1).
    pub largest: Option<usize>,
    /// The budget trials ran under, bytes (CPU), or the GPU's memory.
    pub limit: Option<u64>,
}

/// The search for a run's configuration file (`sweep bench max-batch`).
pub fn run(opts: &SearchOptions) -> Result<Search> {
    let base = TrainConfig::load(&opts.config)?;
    search(&base, opts.memory_limit, opts.steps, opts.max)
}

/// The search: `limit` bytes of resident memory per trial (CPU default: 80% of what is free; a
/// GPU runs until its allocator fails).
pub fn search(base: &TrainConfig, limit: Option<u64>, steps: usize, max: usize) -> Result<Search> {
    if steps < 2 {
        bail!("at least 2 steps per trial: the first is not timed");
    }
    let cpu = base.device == DeviceKind::Cpu;
    let limit = match (limit, cpu) {
        (Some(l), _) => Some(l),
        (None, true) => Some((available_memory()? as f64 * 0.8) as u64),
        (None, false) => None,
    };
    let model = crate::data::tokenizer::model_config(base)?;
    let estimate = |batch: usize| {
        let mut c = base.clone();
        c.batch_size = BatchSize::Fixed(batch);
        memory::estimate(&c, &model).total()
    };
    // The budget the estimate is held against: the limit, else the GPU's size.
    let budget = limit.or_else(|| memory::device_bytes(base, &crate::config::PlanHints::default()));
    let start = match budget {
        Some(b) => {
            let mut s = 1;
            while s * 2 <= max && estimate(s * 2) <= b {
                s *= 2;
            }
            s
        }
        None => 1,
    };
    let exe = std::env::current_exe().context("finding the sweep binary")?;
    let dir = crate::util::fs::scratch_dir_in(&std::env::temp_dir())
        .context("a directory for the trials")?;
    let mut trials = Vec::new();
    let (mut lo, mut hi) = (0usize, None::<usize>);
    let mut batch = start.min(max).max(1);
    loop {
        eprintln!("max-batch: trying batch size {batch}");
        let outcome = trial(&exe, base, batch, steps, limit, dir.path())?;
        let fits = matches!(outcome, Outcome::Trains { .. });
        trials.push(Trial {
            batch,
            outcome,
            estimate_mb: Some(estimate(batch) as f64 / MB),
        });
        if fits {
            lo = batch;
        } else {
            hi = Some(batch);
        }
        batch = match hi {
            // Doubling until something fails or the cap.
            None if batch >= max => break,
            None => (batch * 2).min(max),
            // Then the middle of the gap.
            Some(h) if h - lo <= 1 => break,
            Some(h) => lo + (h - lo) / 2,
        };
    }
    trials.sort_by_key(|t| t.batch);
    Ok(Search {
        trials,
        largest: (lo > 0).then_some(lo),
        limit: budget,
    })
}

/// How an out-of-memory trial ends: the trainer's exit code for it, SIGABRT (a CPU allocation
/// failed) or SIGKILL (the kernel's OOM killer).
fn ran_out_of_memory(status: std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.code() == Some(crate::config::OUT_OF_MEMORY_EXIT)
        || matches!(status.signal(), Some(libc::SIGABRT | libc::SIGKILL))
}

/// One trial: `steps` training steps at `batch` in a child process.
fn trial(
    exe: &Path,
    base: &TrainConfig,
    batch: usize,
    steps: usize,
    limit: Option<u64>,
    dir: &Path,
) -> Result<Outcome> {
    let run = dir.join(format!("bs{batch}"));
    crate::util::fs::make_dir(&run)?;
    let mut cfg = base.clone();
    cfg.batch_size = BatchSize::Fixed(batch);
    cfg.training_steps = steps;
    cfg.logging_frequency = 1;
    cfg.checkpoint_every = 0;
    cfg.checkpoint_at_end = false;
    cfg.validation_every = 0;
    let config = run.join("config.toml");
    std::fs::write(&config, cfg.to_toml())?;
    let log = run.join("train.log");
    // In its own process group, stopped with the search: a leftover trial would hold the memory.
    let mut child = spawn_stoppable(
        Command::new(exe)
            .arg("train")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?),
    )
    .context("starting a trial")?;
    let ended = watch_trial(&mut child, limit);
    forget_child(child.id());
    let status = match ended? {
        Ok(status) => status,
        Err(over) => return Ok(over),
    };
    if !status.success() {
        let text = String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default()).into_owned();
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output")
            .trim()
            .to_string();
        if ran_out_of_memory(status) {
            return Ok(Outcome::OutOfMemory(last));
        }
        bail!(
            "batch size {batch} failed for another reason than memory ({status}): {last} (log: {text:.2000})"
        );
    }
    let log = parse_log(&std::fs::read(run.join(METRICS_FILE))?);
    let timed: Vec<f64> = log
        .steps()
        .filter(|m| m.step >= 2)
        .map(|m| m.tokens_per_second)
        .collect();
    let peak_mb = log.steps().map(|m| m.peak_memory_mb).fold(0.0, f64::max);
    if timed.is_empty() {
        bail!("batch size {batch} trained but logged no timed step");
    }
    // Between two checks the resident memory can pass the budget and come back.
    if let Some(limit) = limit.filter(|_| base.device == DeviceKind::Cpu) {
        if peak_mb * MB > limit as f64 {
            return Ok(Outcome::OutOfMemory(format!(
                "peaked at {peak_mb:.0} MB, over the {:.0} MB budget",
                limit as f64 / MB
            )));
        }
    }
    Ok(Outcome::Trains {
        tokens_per_s: timed.iter().sum::<f64>() / timed.len() as f64,
        peak_mb,
    })
}

/// Waits for a trial: its exit status, or the outcome of passing the memory budget (killed).
fn watch_trial(
    child: &mut std::process::Child,
    limit: Option<u64>,
) -> Result<std::result::Result<std::process::ExitStatus, Outcome>> {
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Ok(s));
        }
        if let Some(limit) = limit {
            let rss = resident_bytes(child.id()).unwrap_or(0);
            if rss > limit {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(Err(Outcome::OutOfMemory(format!(
                    "{:.0} MB resident, over the {:.0} MB budget",
                    rss as f64 / MB,
                    limit as f64 / MB
                ))));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process's resident memory (VmRSS), bytes.
fn resident_bytes(pid: u32) -> Option<u64> {
    proc_kb(&format!("/proc/{pid}/status"), "VmRSS").map(|kb| kb * 1024)
}

/// MemAvailable of this machine, bytes.
fn available_memory() -> Result<u64> {
    let kb =
        proc_kb("/proc/meminfo", "MemAvailable").context("no MemAvailable in /proc/meminfo")?;
    Ok(kb * 1024)
}

/// "2G", "1500M", "512k", "3.5G" or bytes: binary units, as SLURM's `--mem`.
pub fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, unit) = s.split_at(
        s.find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len()),
    );
    let scale: u64 = match unit.trim().to_ascii_uppercase().trim_end_matches('B') {
        "" => 1,
        "K" | "KI" => 1 << 10,
        "M" | "MI" => 1 << 20,
        "G" | "GI" => 1 << 30,
        "T" | "TI" => 1 << 40,
        _ => bail!("`{s}`: a size is a number with K, M, G or T (e.g. 2G, 1500M)"),
    };
    let n: f64 = num
        .parse()
        .with_context(|| format!("`{s}`: a size is a number with K, M, G or T (e.g. 2G, 1500M)"))?;
    if !(n > 0.0 && n.is_finite()) {
        bail!("`{s}`: the size must be positive");
    }
    Ok((n * scale as f64) as u64)
}

/// `max-batch.json`: the answer and its trials, so a requeued run resumes at the same size.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    batch_size: usize,
    trials: Vec<SavedTrial>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedTrial {
    batch_size: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokens_per_second: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    peak_memory_mb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    out_of_memory: Option<String>,
}

pub const SAVED_FILE: &str = "max-batch.json";

/// The run's `batch_size = "max"`: searched at its first start, then read from `max-batch.json`.
pub fn resolve(cfg: &TrainConfig, run_dir: &Path) -> Result<usize> {
    let path = run_dir.join(SAVED_FILE);
    match crate::util::fs::read_regular(&path, 1 << 20, None) {
        Ok(bytes) => {
            let saved: Saved = serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{} is not a batch-size search's record; delete it to search again",
                    path.display()
                )
            })?;
            if saved.batch_size == 0 {
                bail!(
                    "{} says batch size 0; delete it to search again",
                    path.display()
                );
            }
            eprintln!(
                "sweep train: batch_size = \"max\" is {} ({SAVED_FILE})",
                saved.batch_size
            );
            return Ok(saved.batch_size);
        }
        Err(crate::util::fs::ReadError::NotFound) => {}
        Err(e) => bail!("{} {e}", path.display()),
    }
    if crate::train::run::dist::Ranks::from_env()?.world_size > 1 {
        bail!("batch_size = \"max\" is searched on one device; give data-parallel runs a number");
    }
    let limit = cfg.memory_limit_gb.map(|gb| (gb * 1e9) as u64);
    let s = search(cfg, limit, 3, 1024)?;
    let Some(b) = s.largest else {
        bail!(
            "batch_size = \"max\": not even batch size 1 trains on this device{}",
            s.limit.map_or(String::new(), |l| format!(
                " within {:.1} GB",
                l as f64 / 1e9
            ))
        );
    };
    let trials = s
        .trials
        .iter()
        .map(|t| match &t.outcome {
            Outcome::Trains {
                tokens_per_s,
                peak_mb,
            } => SavedTrial {
                batch_size: t.batch,
                tokens_per_second: Some(*tokens_per_s),
                peak_memory_mb: Some(*peak_mb),
                out_of_memory: None,
            },
            Outcome::OutOfMemory(why) => SavedTrial {
                batch_size: t.batch,
                tokens_per_second: None,
                peak_memory_mb: None,
                out_of_memory: Some(why.clone()),
            },
        })
        .collect();
    let saved = Saved {
        batch_size: b,
        trials,
    };
    crate::util::fs::write_atomic(&path, serde_json::to_string_pretty(&saved)?.as_bytes())?;
    eprintln!(
        "sweep train: batch_size = \"max\" is {b}: the largest of {} sizes tried that trains",
        s.trials.len()
    );
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::{parse_size, ran_out_of_memory};

    #[test]
    fn out_of_memory_is_read_from_the_exit_status() {
        use std::os::unix::process::ExitStatusExt;
        use std::process::ExitStatus;
        let code = |c: i32| ExitStatus::from_raw(c << 8);
        assert!(ran_out_of_memory(code(crate::config::OUT_OF_MEMORY_EXIT)));
        assert!(ran_out_of_memory(ExitStatus::from_raw(libc::SIGABRT)));
        assert!(ran_out_of_memory(ExitStatus::from_raw(libc::SIGKILL)));
        assert!(!ran_out_of_memory(code(1)));
        assert!(!ran_out_of_memory(code(crate::config::REQUEUE_EXIT)));
    }

    #[test]
    fn sizes_read_like_slurms() {
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("1500M").unwrap(), 1500 << 20);
        assert_eq!(parse_size("1.5GB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "G", "2X", "-1G", "0M"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
