//! `sweep watchdog`: starts a run's launcher (`srun`, `mpirun`, or the
//! command itself) inside the job, SLURM's or the local executor's, and
//! stops the run when it stops making progress. Progress is a new record:
//! a line of the job's log that matches the command's `line_pattern`, or a
//! new step of every rank of the built-in trainer (`progress/rank-<r>`).
//! When none comes for `[watchdog] stall` (or no first one within
//! `startup`), it gathers the evidence ([`evidence`]), stops the launcher
//! (SIGTERM, then SIGKILL), records why in the job's entry of `run.json`
//! with the evidence in `watchdog.log`, and exits [`HUNG_EXIT`]: the run is HUNG. Otherwise it exits as the launcher
//! did. docs/running.md, "When a run hangs".

mod evidence;
mod progress;

pub use evidence::{ask_for_stacks, probe};

use crate::config::HUNG_EXIT;
use crate::manifest::Stall;
use crate::plan::record::{record_stop, Stop, StoppedBy};
use crate::util::heartbeat;
use anyhow::{bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use progress::Progress;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

/// How often the watchdog looks.
const POLL: Duration = Duration::from_millis(500);
/// How long the stopped launcher has to end after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(10);

pub struct Options {
    pub dir: PathBuf,
    /// The job as `exit_code` names it (`<id>` or `<array id>_<task>`).
    pub job: String,
    pub stall: Stall,
    /// Seconds; `None`: no startup limit.
    pub startup: Option<u64>,
    /// A command's progress lines; without it, the trainer's ranks report.
    pub pattern: Option<regex::Regex>,
    pub argv: Vec<OsString>,
}

/// Which limit ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// No first record within `startup` seconds.
    Startup(u64),
    /// No new record for this many seconds, once records came.
    Stall(u64),
}

impl Limit {
    pub fn seconds(self) -> u64 {
        match self {
            Limit::Startup(s) | Limit::Stall(s) => s,
        }
    }
}

/// Runs the launcher under watch; the exit code is the launcher's, or
/// [`HUNG_EXIT`] when the watchdog stopped it.
pub fn run(o: Options) -> Result<ExitCode> {
    let Some(program) = o.argv.first() else {
        bail!("sweep watchdog: no launcher to start (give it after `--`)");
    };
    heartbeat::clear(&o.dir).with_context(|| {
        format!(
            "clearing the last job's progress in {}",
            heartbeat::dir(&o.dir).display()
        )
    })?;
    let token = format!(
        "{}:{}",
        crate::util::process::host_name(),
        std::process::id()
    );
    let mut progress = Progress::new(&o.dir, o.pattern.clone());
    let forward = crate::util::signals::StopSignals::install(&FORWARDED)?;
    let mut child = Command::new(program)
        .args(&o.argv[1..])
        .env(heartbeat::ENV, &token)
        // Its own group: the watchdog stops the launcher and all it started.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", program.to_string_lossy()))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(exit_code(status));
        }
        if let Some(sig) = forward.take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::try_from(sig)?);
        }
        progress.poll();
        if let Some(limit) = due(&o, &progress, started.elapsed()) {
            return stop(&o, &token, &mut child, &progress, limit, started.elapsed());
        }
        std::thread::sleep(POLL);
    }
}

/// What the job's shell and the scheduler send to the job, passed on to
/// the launcher's group: stop signals (which the trainer answers with a
/// checkpoint) and SLURM's time-limit warning.
const FORWARDED: [i32; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1];

/// The limit that ran out now, if one did.
fn due(o: &Options, p: &Progress, running: Duration) -> Option<Limit> {
    match p.quiet() {
        None => {
            let startup = o.startup?;
            (running.as_secs() >= startup).then_some(Limit::Startup(startup))
        }
        Some(quiet) => {
            let limit = stall_limit(o.stall, &p.intervals())?;
            (quiet.as_secs() >= limit).then_some(Limit::Stall(limit))
        }
    }
}

/// `[watchdog] stall` in seconds, given the intervals between progress
/// records so far: `auto` is the larger of 10 × their median and 5
/// minutes.
pub fn stall_limit(stall: Stall, intervals: &[f64]) -> Option<u64> {
    match stall {
        Stall::Off => None,
        Stall::After(s) => Some(s),
        Stall::Auto => {
            let median = crate::util::median(intervals).unwrap_or(0.0);
            let auto = (Stall::AUTO_FACTOR * median).ceil();
            Some((auto as u64).max(Stall::AUTO_FLOOR_S))
        }
    }
}

/// The evidence first, while every process is as it hung; then the
/// launcher stopped, and the run recorded HUNG.
fn stop(
    o: &Options,
    token: &str,
    child: &mut Child,
    p: &Progress,
    limit: Limit,
    running: Duration,
) -> Result<ExitCode> {
    // Measured as the limit ran out, before the evidence takes its time.
    let quiet = p.quiet().unwrap_or(running);
    let found = evidence::gather(&o.dir, token, p, limit, quiet, running);
    eprintln!("sweep watchdog: {}", found.reason);
    let stop = Stop {
        by: StoppedBy::Watchdog,
        reason: found.reason.clone(),
        ranks: found.ranks.clone(),
        nodes: found.nodes.clone(),
        at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        quiet_s: Some(quiet.as_secs_f64()),
        limit_s: Some(limit.seconds()),
    };
    let log = o.dir.join(crate::layout::WATCHDOG_LOG);
    if let Err(e) = crate::util::fs::write_atomic(&log, found.text.as_bytes()) {
        eprintln!("sweep watchdog: could not write {}: {e:#}", log.display());
    }
    // The run is stopped whether or not its record can say why.
    if let Err(e) = record_stop(&o.dir, &o.job, stop) {
        eprintln!("sweep watchdog: could not record the stop: {e:#}");
    }
    end(child);
    eprintln!(
        "sweep watchdog: stopped the run; evidence in {}",
        log.display()
    );
    Ok(ExitCode::from(HUNG_EXIT as u8))
}

/// SIGTERM to the launcher's group, SIGKILL to what is left after
/// [`GRACE`] (a stopped process ends only so). `srun` passes both on to the
/// run's tasks on every node.
fn end(child: &mut Child) {
    let group = Pid::from_raw(child.id() as i32);
    let _ = killpg(group, Signal::SIGTERM);
    let asked = Instant::now();
    while asked.elapsed() < GRACE {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = killpg(group, Signal::SIGKILL);
    let _ = child.wait();
}

/// The launcher's status as its shell would give it: 128 + N for signal N.
fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    ExitCode::from(code.clamp(0, 255) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_ten_medians_and_never_under_five_minutes() {
        assert_eq!(stall_limit(Stall::Auto, &[]), Some(300));
        assert_eq!(stall_limit(Stall::Auto, &[20.0, 20.5, 19.5]), Some(300));
        assert_eq!(stall_limit(Stall::Auto, &[40.0, 45.0, 400.0]), Some(450));
        assert_eq!(stall_limit(Stall::After(7), &[100.0]), Some(7));
        assert_eq!(stall_limit(Stall::Off, &[1.0]), None);
    }
}
