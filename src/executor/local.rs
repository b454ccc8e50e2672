//! The local executor: runs jobs as child processes on this machine, N at a
//! time, stages before the runs that need them. Each job logs to
//! `<dir>/local.out` and records its state in `<dir>/local.json`. Ctrl-C
//! (SIGINT/SIGTERM) stops the children cleanly: SIGTERM to each job's process
//! group (the trainer checkpoints on it), SIGKILL after a grace period.

use super::{job_env, Decision, State, Status, Unit, UnitKind};
use crate::manifest::ExecutorKind;
use anyhow::{Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const STATE_FILE: &str = "local.json";
pub const LOG_FILE: &str = "local.out";
use crate::config::REQUEUE_EXIT;
const MAX_REQUEUES: u32 = 10;
const GRACE: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LocalState {
    job_id: String,
    state: State,
    /// The job's process (also its process group).
    pid: Option<u32>,
    /// The `sweep` process that runs the job.
    owner_pid: u32,
    exit_code: Option<i32>,
    signal: Option<i32>,
    reason: Option<String>,
    started_at: Option<String>,
    ended_at: Option<String>,
    /// Set by `sweep cancel`: the job must not be started or restarted.
    #[serde(default)]
    cancel_requested: bool,
}

impl LocalState {
    fn save(&self, dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self).expect("serialises");
        crate::util::fs::write_atomic(&dir.join(STATE_FILE), &bytes)
    }

    fn load(dir: &Path) -> Option<LocalState> {
        serde_json::from_slice(&std::fs::read(dir.join(STATE_FILE)).ok()?).ok()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct LocalOptions {
    pub parallel: usize,
    /// CPU threads per job (0: cores / parallel).
    pub threads: usize,
}

/// What happened to each unit that was run.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub name: String,
    pub kind: UnitKind,
    pub status: Status,
    pub seconds: f64,
}

struct Running {
    unit: usize,
    child: Child,
    started: Instant,
    state: LocalState,
    requeues: u32,
}

/// Runs the units the decisions say to submit, until all are done or the user
/// interrupts. `on_event` is told about every start and end.
/// `on_tick` is called about once a second (for a live view).
pub fn run(
    units: &mut [Unit],
    decisions: &[Decision],
    opts: LocalOptions,
    mut on_event: impl FnMut(&Outcome, bool),
    mut on_tick: impl FnMut(),
) -> Result<(Vec<Outcome>, bool)> {
    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&interrupted))
            .context("installing the Ctrl-C handler")?;
    }
    let threads = if opts.threads > 0 {
        opts.threads
    } else {
        (std::thread::available_parallelism().map_or(1, |n| n.get()) / opts.parallel.max(1)).max(1)
    };
    let owner = std::process::id();

    // Queue everything first so `sweep status` shows it as PENDING.
    let mut queue: VecDeque<usize> = VecDeque::new();
    for (i, u) in units.iter_mut().enumerate() {
        if decisions[i] != Decision::Submit {
            continue;
        }
        let job_id = format!("local-{owner}-{i}");
        u.record_job(ExecutorKind::Local, job_id.clone())?;
        LocalState {
            job_id,
            state: State::Pending,
            pid: None,
            owner_pid: owner,
            exit_code: None,
            signal: None,
            reason: None,
            started_at: None,
            ended_at: None,
            cancel_requested: false,
        }
        .save(&u.dir)?;
        queue.push_back(i);
    }

    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut done: Vec<Option<State>> = vec![None; units.len()];
    // Stages that are cached or already completed count as done.
    for (i, d) in decisions.iter().enumerate() {
        match d {
            Decision::Cached | Decision::Skip(State::Completed) => done[i] = Some(State::Completed),
            Decision::SkipFailed(s) | Decision::Skip(s)
                if units[i].kind == UnitKind::Stage && !s.is_active() =>
            {
                done[i] = Some(*s)
            }
            _ => {}
        }
    }
    let mut running: Vec<Running> = Vec::new();
    let mut last_tick = Instant::now();

    loop {
        if last_tick.elapsed() >= Duration::from_secs(1) {
            on_tick();
            last_tick = Instant::now();
        }
        if interrupted.load(Ordering::SeqCst) {
            stop_all(units, &mut running, &mut outcomes, &mut on_event)?;
            for i in queue.drain(..) {
                let o =
                    finish_unstarted(units, i, State::Cancelled, "interrupted before it started")?;
                on_event(&o, false);
                outcomes.push(o);
            }
            return Ok((outcomes, true));
        }

        // Start what is ready.
        let mut waiting = VecDeque::new();
        while let Some(i) = queue.pop_front() {
            let stage_state = units[i].stage.map(|s| done[s]);
            match stage_state {
                Some(None) => waiting.push_back(i), // its stage is still running
                Some(Some(s)) if s != State::Completed => {
                    let o = finish_unstarted(
                        units,
                        i,
                        State::Cancelled,
                        "its pretokenize stage did not complete (DependencyNeverSatisfied)",
                    )?;
                    done[i] = Some(State::Cancelled);
                    on_event(&o, false);
                    outcomes.push(o);
                }
                _ if cancel_requested(&units[i].dir) => {
                    let o = finish_unstarted(
                        units,
                        i,
                        State::Cancelled,
                        "cancelled before it started",
                    )?;
                    done[i] = Some(State::Cancelled);
                    on_event(&o, false);
                    outcomes.push(o);
                }
                _ if running.len() < opts.parallel => {
                    let r = start(&units[i], i, threads, owner, 0)?;
                    on_event(&outcome(&units[i], &r.state, 0.0), true);
                    running.push(r);
                }
                _ => waiting.push_back(i),
            }
        }
        queue = waiting;

        // Reap what finished.
        let mut k = 0;
        while k < running.len() {
            if let Some(exit) = running[k].child.try_wait()? {
                let mut r = running.swap_remove(k);
                let (code, signal) = exit_parts(exit);
                let cancelled = cancel_requested(&units[r.unit].dir);
                if code == Some(REQUEUE_EXIT) && r.requeues < MAX_REQUEUES && !cancelled {
                    // Checkpointed on a signal: start it again, like SLURM's requeue.
                    let again = start(&units[r.unit], r.unit, threads, owner, r.requeues + 1)?;
                    running.push(again);
                    continue;
                }
                r.state.exit_code = code;
                r.state.signal = signal;
                r.state.state = match (code, signal) {
                    (Some(0), _) => State::Completed,
                    _ if cancelled || signal.is_some() => State::Cancelled,
                    _ => State::Failed,
                };
                r.state.cancel_requested = cancelled;
                r.state.ended_at = Some(crate::util::now_rfc3339());
                r.state.save(&units[r.unit].dir)?;
                done[r.unit] = Some(r.state.state);
                let o = outcome(&units[r.unit], &r.state, r.started.elapsed().as_secs_f64());
                on_event(&o, false);
                outcomes.push(o);
            } else {
                k += 1;
            }
        }
        if queue.is_empty() && running.is_empty() {
            return Ok((outcomes, false));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start(u: &Unit, index: usize, threads: usize, owner: u32, requeues: u32) -> Result<Running> {
    let log_path = u.dir.join(LOG_FILE);
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    writeln!(
        log,
        "sweep: local job for {} ({}) started at {}, restart {requeues}",
        u.name,
        u.id,
        crate::util::now_rfc3339()
    )?;
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(crate::template::launch_line(&u.command))
        .envs(job_env(u))
        .env("RANK", "0")
        .env("LOCAL_RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("SWEEP_THREADS", threads.to_string())
        .env("RAYON_NUM_THREADS", threads.to_string())
        .env("OMP_NUM_THREADS", threads.to_string())
        .env("SWEEP_RESTART_COUNT", requeues.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: Ctrl-C in the terminal reaches sweep only,
        // and sweep stops each job's whole tree.
        .process_group(0);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", u.name))?;
    let job_id = u
        .record
        .last_job()
        .map(|j| j.job_id.clone())
        .unwrap_or_default();
    let state = LocalState {
        job_id,
        state: State::Running,
        pid: Some(child.id()),
        owner_pid: owner,
        exit_code: None,
        signal: None,
        reason: None,
        started_at: Some(crate::util::now_rfc3339()),
        ended_at: None,
        cancel_requested: false,
    };
    state.save(&u.dir)?;
    Ok(Running {
        unit: index,
        child,
        started: Instant::now(),
        state,
        requeues,
    })
}

/// SIGTERM to every job's process group, SIGKILL after the grace period.
fn stop_all(
    units: &[Unit],
    running: &mut Vec<Running>,
    outcomes: &mut Vec<Outcome>,
    on_event: &mut impl FnMut(&Outcome, bool),
) -> Result<()> {
    for r in running.iter() {
        let _ = killpg(Pid::from_raw(r.child.id() as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + GRACE;
    while !running.is_empty() {
        let mut k = 0;
        while k < running.len() {
            if let Some(exit) = running[k].child.try_wait()? {
                let mut r = running.swap_remove(k);
                let (code, signal) = exit_parts(exit);
                r.state.exit_code = code;
                r.state.signal = signal;
                r.state.state = State::Cancelled;
                r.state.reason = Some("interrupted (Ctrl-C)".into());
                r.state.ended_at = Some(crate::util::now_rfc3339());
                r.state.save(&units[r.unit].dir)?;
                let o = outcome(&units[r.unit], &r.state, r.started.elapsed().as_secs_f64());
                on_event(&o, false);
                outcomes.push(o);
            } else {
                k += 1;
            }
        }
        if Instant::now() > deadline {
            for r in running.iter() {
                let _ = killpg(Pid::from_raw(r.child.id() as i32), Signal::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn finish_unstarted(units: &[Unit], i: usize, state: State, reason: &str) -> Result<Outcome> {
    let u = &units[i];
    let mut s = LocalState::load(&u.dir).context("reading the local job state")?;
    s.state = state;
    s.reason = Some(reason.into());
    s.ended_at = Some(crate::util::now_rfc3339());
    s.save(&u.dir)?;
    Ok(outcome(u, &s, 0.0))
}

fn outcome(u: &Unit, s: &LocalState, seconds: f64) -> Outcome {
    Outcome {
        name: u.name.clone(),
        kind: u.kind,
        status: to_status(s),
        seconds,
    }
}

fn to_status(s: &LocalState) -> Status {
    Status {
        state: s.state,
        exit_code: s.exit_code,
        signal: s.signal,
        reason: s.reason.clone(),
        job_id: Some(s.job_id.clone()),
    }
}

fn exit_parts(exit: std::process::ExitStatus) -> (Option<i32>, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    (exit.code(), exit.signal())
}

/// The state of a local job, checking that its process (or, while pending,
/// the `sweep` that owns it) still exists.
pub fn status(dir: &Path, job_id: &str) -> Status {
    let Some(s) = LocalState::load(dir) else {
        return Status::new(State::Unknown).with_reason("no local.json in the run directory");
    };
    if s.job_id != job_id {
        return Status::new(State::Unknown)
            .with_reason(format!("local.json belongs to {}, not {job_id}", s.job_id));
    }
    let watch = match s.state {
        State::Running => s.pid,
        State::Pending => Some(s.owner_pid),
        _ => None,
    };
    if let Some(pid) = watch {
        if !alive(pid) {
            return Status::new(State::Unknown)
                .with_reason("the sweep process running it stopped before it finished");
        }
    }
    to_status(&s)
}

/// The state a local job's record shows, without checking its process
/// (for live views, many times a second).
pub fn peek_state(dir: &Path) -> Option<State> {
    LocalState::load(dir).map(|s| s.state)
}

/// Present and not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn cancel_requested(dir: &Path) -> bool {
    LocalState::load(dir).is_some_and(|s| s.cancel_requested)
}

/// Stops a local job from another process (`sweep cancel`): marks it so its
/// `sweep` neither starts nor restarts it, then signals a running one.
pub fn cancel(dir: &Path) -> Result<()> {
    let Some(mut s) = LocalState::load(dir) else {
        return Ok(());
    };
    s.cancel_requested = true;
    s.save(dir)?;
    if let (State::Running, Some(pid)) = (s.state, s.pid) {
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
    }
    Ok(())
}
