//! `sweep watchdog`: starts a run's launcher inside the job and stops the run when it stops
//! making progress (a log line matching `line_pattern`, or a new step of every trainer rank).
//! With none for `[watchdog] stall` (or `startup`), it gathers evidence, stops the run, records
//! why in `run.json` and `watchdog.log`, and exits [`HUNG_EXIT`]; else as the launcher did.
//! docs/running.md, "When a run hangs".

mod evidence;
mod progress;

pub use evidence::{ask_for_stacks, probe};

use crate::config::HUNG_EXIT;
use crate::manifest::Stall;
use crate::plan::record::{record_stop, Stop, StoppedBy};
use crate::util::heartbeat;
use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use progress::Progress;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

/// How often the watchdog looks.
const POLL: Duration = Duration::from_millis(500);
/// How long the stopped launcher has to end after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(10);

pub struct WatchOptions {
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

/// Runs the launcher under watch: its exit code, or [`HUNG_EXIT`].
pub fn run(o: WatchOptions) -> Result<ExitCode> {
    let Some(program) = o.argv.first() else {
        bail!("sweep watchdog: no launcher to start (give it after `--`)");
    };
    // It writes into the directory: only a run's, never one a mistyped `--dir` names.
    match crate::plan::record::RunRecord::read(&o.dir.join(crate::layout::RUN_JSON), None) {
        Ok(Some(_)) => {}
        Ok(None) => bail!(
            "sweep watchdog: {} is no run directory (it has no {}): give the run's own, as its job script does",
            o.dir.display(),
            crate::layout::RUN_JSON
        ),
        Err(e) => bail!("sweep watchdog: {} is no run directory: {e:#}", o.dir.display()),
    }
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
    // The watchdog outlives the signals that stop a job, to pass on the launcher's exit.
    let stop = crate::util::signals::StopSignals::install(&OUTLIVED)?;
    let mut child = Command::new(program)
        .args(&o.argv[1..])
        .env(heartbeat::ENV, &token)
        .spawn()
        .with_context(|| format!("starting {}", program.to_string_lossy()))?;
    let started = Instant::now();
    let mut stopping = false;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(exit_code(status));
        }
        if let Some(sig) = stop.take() {
            pass_on(&child, sig);
            // A stopping run makes no progress (it checkpoints): waited for, never hung.
            stopping = true;
        }
        progress.poll();
        if let Some(limit) = due(&o, &progress, started.elapsed()).filter(|_| !stopping) {
            return stop_hung(&o, &token, &mut child, &progress, limit, started.elapsed());
        }
        std::thread::sleep(POLL);
    }
}

/// The signals stopping a job (and SLURM's warning), answered by the launcher, outlived here.
const OUTLIVED: [i32; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1];

/// A stop signal passed on only to a launcher that left its process group: the others have it,
/// and a second would make srun abort its step.
fn pass_on(child: &Child, sig: i32) {
    let launcher = Pid::from_raw(child.id() as i32);
    let apart =
        nix::unistd::getpgid(Some(launcher)).is_ok_and(|group| group != nix::unistd::getpgrp());
    if apart {
        if let Ok(sig) = Signal::try_from(sig) {
            let _ = kill(launcher, sig);
        }
    }
}

/// The limit that ran out now, if one did.
fn due(o: &WatchOptions, p: &Progress, running: Duration) -> Option<Limit> {
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

/// `[watchdog] stall` in seconds; `auto`: the larger of 10 × the median interval and 5 minutes.
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

/// The evidence first, while every process is as it hung; then the stop, recorded HUNG.
fn stop_hung(
    o: &WatchOptions,
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
    end(child, token);
    eprintln!(
        "sweep watchdog: stopped the run; evidence in {}",
        log.display()
    );
    Ok(ExitCode::from(HUNG_EXIT as u8))
}

/// SIGTERM to the run's processes here (by their inherited token), SIGKILL after [`GRACE`].
fn end(child: &mut Child, token: &str) {
    // The launcher by its pid only while unreaped (a reaped pid may be another process's).
    let signal_all = |sig: Signal, launcher: Option<u32>| {
        for pid in evidence::probe_pids(token).into_iter().chain(launcher) {
            let _ = kill(Pid::from_raw(pid as i32), sig);
        }
    };
    signal_all(Signal::SIGTERM, Some(child.id()));
    let asked = Instant::now();
    let mut reaped = false;
    while asked.elapsed() < GRACE {
        reaped = reaped || matches!(child.try_wait(), Ok(Some(_)));
        if reaped && evidence::probe_pids(token).is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    signal_all(Signal::SIGKILL, (!reaped).then(|| child.id()));
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
