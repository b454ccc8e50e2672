//! The local executor: jobs as child processes, N at a time, stages first. Each job logs to
//! `local.out`, records its state in `local.json`, and its shell writes its exit status into
//! `exit_code`, so how it ended is known even if sweep was killed. A stop signal sends SIGTERM
//! to each job's group, SIGKILL after a grace; what did not finish is INTERRUPTED, and the
//! next `sweep run` continues it.

use super::{ended, job_env, Decision, Event, Executor, State, Status, Submitted, Unit, UnitKind};
use crate::manifest::{ExecutorKind, Launcher};
use crate::plan::launch::Watch;
use crate::util::process::{alive, find_in_path, process_start, same_process, stop_group};
use crate::util::signals::{self, StopSignals};
use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const STATE_FILE: &str = "local.json";
pub const LOG_FILE: &str = "local.out";
use crate::config::REQUEUE_EXIT;
const MAX_REQUEUES: u32 = 10;
const GRACE: Duration = Duration::from_secs(20);
/// The most ranks of one run started on this machine.
const MAX_RANKS: u32 = 256;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LocalState {
    job_id: String,
    state: State,
    /// The job's process (also its process group).
    pid: Option<u32>,
    /// When that process started (`/proc/<pid>/stat`): a later process with its pid is not it.
    #[serde(default)]
    pid_start: Option<u64>,
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
    /// How many times the run started before in this directory: `SWEEP_RESTART_COUNT`.
    #[serde(default)]
    restarts: u32,
}

impl LocalState {
    /// How many times the run in `dir` has started so far.
    fn starts_before(dir: &Path) -> u32 {
        LocalState::load(dir).map_or(0, |s| {
            s.restarts.saturating_add(u32::from(s.started_at.is_some()))
        })
    }

    /// Seconds from its start to its end, once both are recorded.
    fn run_s(&self) -> Option<u64> {
        let at = |t: &Option<String>| chrono::DateTime::parse_from_rfc3339(t.as_deref()?).ok();
        let (start, end) = (at(&self.started_at)?, at(&self.ended_at)?);
        u64::try_from((end - start).num_seconds()).ok()
    }

    fn new(job_id: String, state: State, owner_pid: u32) -> LocalState {
        LocalState {
            job_id,
            state,
            pid: None,
            pid_start: None,
            owner_pid,
            exit_code: None,
            signal: None,
            reason: None,
            started_at: None,
            ended_at: None,
            cancel_requested: false,
            restarts: 0,
        }
    }

    fn save(&self, dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self).expect("serialises");
        crate::util::fs::write_atomic(&dir.join(STATE_FILE), &bytes)
    }

    fn load(dir: &Path) -> Option<LocalState> {
        let bytes = crate::util::fs::read_regular(&dir.join(STATE_FILE), 16 << 20, None).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct LocalOptions {
    pub parallel: usize,
    /// CPU threads per job (0: cores / parallel).
    pub threads: usize,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            parallel: 1,
            threads: 0,
        }
    }
}

/// What happened to each unit that was run.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub name: String,
    pub kind: UnitKind,
    pub status: Status,
    pub seconds: f64,
    /// For a unit that did not complete, its log's last line: usually the error.
    pub last_log_line: Option<String>,
}

struct Running {
    unit: usize,
    child: Child,
    started: Instant,
    state: LocalState,
    requeues: u32,
}

/// The local executor with its options.
pub struct LocalExecutor(pub LocalOptions);

impl Executor for LocalExecutor {
    fn submit(
        &self,
        _study_dir: &Path,
        units: &mut [Unit],
        decisions: &[Decision],
        dry_run: bool,
        on: &mut dyn FnMut(Event<'_>),
    ) -> Result<Submitted> {
        if dry_run {
            for (u, d) in units.iter().zip(decisions) {
                if *d == Decision::Submit {
                    on(Event::WouldRun {
                        name: &u.name,
                        command: &u.command,
                    });
                }
            }
            return Ok(Submitted::default());
        }
        // Every rank of a local run is a process here: every run fits, or nothing starts.
        for u in units
            .iter()
            .zip(decisions)
            .filter(|(_, d)| **d == Decision::Submit)
            .map(|(u, _)| u)
        {
            let launch = u.local.as_ref().map_err(|why| anyhow!("{why}"))?;
            if launch.world_size > MAX_RANKS {
                bail!(
                    "{} has {} ranks, and the local executor starts every rank on this machine (at most {MAX_RANKS}): submit it to SLURM (`--executor slurm`)",
                    u.name,
                    launch.world_size
                );
            }
            // Every launcher is found first: a study sweeping `launcher` fails before it began.
            let (tool, install) = match launch.launcher {
                Launcher::Torchrun => ("torchrun", "install PyTorch (pip install torch) where sweep runs, or activate its environment"),
                Launcher::Mpirun => ("mpirun", "install Open MPI (apt-get install openmpi-bin) or MPICH"),
                Launcher::None | Launcher::Srun => continue,
            };
            if find_in_path(tool).is_none() {
                bail!("{}: `launcher = \"{tool}\"`, and there is no {tool} on PATH: {install}; no run was started", u.name);
            }
        }
        let (outcomes, interrupted) = run(units, decisions, self.0, on)?;
        Ok(Submitted {
            outcomes,
            interrupted,
            held: None,
        })
    }

    fn statuses(&self, jobs: &[(&str, &Path)]) -> Result<Vec<Status>> {
        Ok(jobs.iter().map(|(id, dir)| status(dir, id)).collect())
    }

    fn cancel(&self, jobs: &[(&str, &Path)]) -> Result<()> {
        for (_, dir) in jobs {
            cancel(dir).with_context(|| format!("cancelling the job in {}", dir.display()))?;
        }
        Ok(())
    }
}

/// Runs the units to submit until all are done or a stop signal arrives; returns the outcomes
/// and that signal.
pub fn run(
    units: &mut [Unit],
    decisions: &[Decision],
    opts: LocalOptions,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<(Vec<Outcome>, Option<i32>)> {
    let stop = StopSignals::install_interactive(&signals::INTERRUPTS)?;
    let mut pool = Pool::new(units, decisions, opts)?;
    let mut last_tick = Instant::now();
    loop {
        if let Some(sig) = stop.received() {
            if sig == signals::SIGHUP {
                signals::detach_from_terminal();
            }
            pool.stop_all(units, &format!("stopped by {}", signals::name(sig)), on)?;
            return Ok((pool.outcomes, Some(sig)));
        }
        if last_tick.elapsed() >= Duration::from_secs(1) {
            on(Event::Tick);
            last_tick = Instant::now();
        }
        if let Err(e) = pool
            .start_ready(units, on)
            .and_then(|()| pool.reap(units, on))
        {
            // The jobs already started are stopped, never left unfollowed.
            pool.stop_all(units, "stopped by an error of sweep's", on)?;
            return Err(e);
        }
        if pool.queue.is_empty() && pool.running.is_empty() {
            return Ok((pool.outcomes, None));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A job that exited, and how (its shell's status, as it records it).
type Exited = (Running, Status);

/// The jobs of one `run`: queued, running, and how each unit ended.
struct Pool {
    opts: LocalOptions,
    threads: usize,
    owner: u32,
    queue: VecDeque<usize>,
    running: Vec<Running>,
    /// Stages running under another process (a `sweep` killed earlier).
    elsewhere: Vec<usize>,
    /// When `elsewhere` was last looked at.
    checked: Option<Instant>,
    /// How each unit ended (`None`: not yet), for the runs waiting on a stage.
    done: Vec<Option<State>>,
    outcomes: Vec<Outcome>,
}

impl Pool {
    /// Queues every unit to submit as PENDING at once, for `sweep status`.
    fn new(units: &mut [Unit], decisions: &[Decision], opts: LocalOptions) -> Result<Pool> {
        let threads = if opts.threads > 0 {
            opts.threads
        } else {
            (crate::config::runtime::cores() / opts.parallel.max(1)).max(1)
        };
        let owner = std::process::id();
        let mut queue = VecDeque::new();
        let mut elsewhere = Vec::new();
        let mut done = vec![None; units.len()];
        for (i, (u, d)) in units.iter_mut().zip(decisions).enumerate() {
            match d {
                Decision::Submit => {
                    let job_id = format!("local-{owner}-{i}");
                    u.record_job(ExecutorKind::Local, job_id.clone())?;
                    LocalState {
                        restarts: LocalState::starts_before(&u.dir),
                        ..LocalState::new(job_id, State::Pending, owner)
                    }
                    .save(&u.dir)?;
                    queue.push_back(i);
                }
                Decision::Cached | Decision::Skip(State::Completed) => {
                    done[i] = Some(State::Completed)
                }
                Decision::SkipFailed(s) | Decision::Skip(s)
                    if u.kind == UnitKind::Stage && !s.is_active() =>
                {
                    done[i] = Some(*s)
                }
                // Still running under a killed `sweep`: followed until it ends.
                Decision::Skip(_) if u.kind == UnitKind::Stage => elsewhere.push(i),
                _ => {}
            }
        }
        Ok(Pool {
            opts,
            threads,
            owner,
            queue,
            running: Vec::new(),
            elsewhere,
            checked: None,
            done,
            outcomes: Vec::new(),
        })
    }

    /// Notes the end of stages that run under another process, once a second.
    fn follow_elsewhere(&mut self, units: &[Unit]) -> Result<()> {
        if self.elsewhere.is_empty()
            || self
                .checked
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return Ok(());
        }
        self.checked = Some(Instant::now());
        let records: Vec<_> = self
            .elsewhere
            .iter()
            .map(|&i| (&units[i].record, units[i].dir.as_path()))
            .collect();
        let states = super::record_statuses(&records)?;
        let mut still = Vec::new();
        for (&i, s) in self.elsewhere.iter().zip(states) {
            if s.state.is_active() {
                still.push(i);
            } else {
                self.done[i] = Some(s.state);
            }
        }
        self.elsewhere = still;
        Ok(())
    }

    fn ended(&mut self, o: Outcome, on: &mut dyn FnMut(Event<'_>)) {
        on(Event::Ended(&o));
        self.outcomes.push(o);
    }

    /// Starts queued units whose stage is done, `parallel` at a time; cancels those whose stage
    /// failed or that `sweep cancel` marked.
    fn start_ready(&mut self, units: &[Unit], on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        self.follow_elsewhere(units)?;
        let mut waiting = VecDeque::new();
        while let Some(i) = self.queue.pop_front() {
            let not_started = match units[i].stage.map(|s| self.done[s]) {
                Some(None) => {
                    waiting.push_back(i); // its stage is still running
                    continue;
                }
                Some(Some(State::Interrupted)) => Some((
                    State::Interrupted,
                    "its pretokenize stage was interrupted; `sweep run` runs both",
                )),
                Some(Some(s)) if s != State::Completed => Some((
                    State::Cancelled,
                    "its pretokenize stage did not complete (DependencyNeverSatisfied)",
                )),
                _ if cancel_requested(&units[i].dir) => {
                    Some((State::Cancelled, "cancelled before it started"))
                }
                _ => None,
            };
            if let Some((state, reason)) = not_started {
                let o = finish_unstarted(units, i, state, reason)?;
                self.done[i] = Some(state);
                self.ended(o, on);
            } else if self.running.len() < self.opts.parallel {
                let r = start(&units[i], i, self.threads, self.owner, 0)?;
                on(Event::Started(&outcome(&units[i], &r.state, 0.0)));
                self.running.push(r);
            } else {
                waiting.push_back(i);
            }
        }
        self.queue = waiting;
        Ok(())
    }

    /// Collects exited jobs; one that checkpointed on a signal (exit 99) starts again.
    fn reap(&mut self, units: &[Unit], on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        for (mut r, status) in self.take_exited()? {
            let dir = &units[r.unit].dir;
            stop_leftovers(r.child.id(), dir);
            let status = ended::explain(dir, &r.state.job_id, status);
            let cancelled = cancel_requested(dir);
            if status.exit_code == Some(REQUEUE_EXIT) && r.requeues < MAX_REQUEUES && !cancelled {
                let again = start(
                    &units[r.unit],
                    r.unit,
                    self.threads,
                    self.owner,
                    r.requeues + 1,
                )?;
                self.running.push(again);
                continue;
            }
            r.state.state = match status.state {
                State::Completed => State::Completed,
                _ if cancelled => State::Cancelled,
                // Signalled by someone else: it did not complete.
                st => st,
            };
            r.state.exit_code = status.exit_code;
            r.state.signal = status.signal;
            r.state.reason = status.reason;
            r.state.cancel_requested = cancelled;
            r.state.ended_at = Some(crate::util::now_rfc3339());
            r.state.save(dir)?;
            self.done[r.unit] = Some(r.state.state);
            let o = outcome(&units[r.unit], &r.state, r.started.elapsed().as_secs_f64());
            self.ended(o, on);
        }
        Ok(())
    }

    /// The running jobs that have exited, with how they ended.
    fn take_exited(&mut self) -> Result<Vec<Exited>> {
        let mut exited = Vec::new();
        let mut k = 0;
        while k < self.running.len() {
            match self.running[k].child.try_wait()? {
                Some(exit) => {
                    let status = exit_status(exit);
                    exited.push((self.running.swap_remove(k), status));
                }
                None => k += 1,
            }
        }
        Ok(exited)
    }

    /// A stop signal: SIGTERM to every job's group, SIGKILL after the grace; what did not finish
    /// is INTERRUPTED, for the next `sweep run`.
    fn stop_all(&mut self, units: &[Unit], why: &str, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        for r in self.running.iter() {
            let _ = killpg(Pid::from_raw(r.child.id() as i32), Signal::SIGTERM);
        }
        let deadline = Instant::now() + GRACE;
        while !self.running.is_empty() {
            for (mut r, status) in self.take_exited()? {
                r.state.state = match status.state {
                    // It finished before the signal reached it.
                    State::Completed => State::Completed,
                    _ => State::Interrupted,
                };
                r.state.exit_code = status.exit_code;
                r.state.signal = status.signal;
                r.state.reason = Some(match status.exit_code {
                    Some(REQUEUE_EXIT) => {
                        format!("{why}; checkpoint written, `sweep run` continues from it")
                    }
                    _ => format!("{why}; `sweep run` runs it again"),
                });
                r.state.ended_at = Some(crate::util::now_rfc3339());
                r.state.save(&units[r.unit].dir)?;
                let o = outcome(&units[r.unit], &r.state, r.started.elapsed().as_secs_f64());
                self.ended(o, on);
            }
            if Instant::now() > deadline {
                for r in self.running.iter() {
                    let _ = killpg(Pid::from_raw(r.child.id() as i32), Signal::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for i in std::mem::take(&mut self.queue) {
            let reason = format!("{why} before it started; `sweep run` runs it");
            let o = finish_unstarted(units, i, State::Interrupted, &reason)?;
            self.ended(o, on);
        }
        Ok(())
    }
}

/// What names a SLURM task: unset for a local job, even inside an allocation, where it would
/// name sweep's own task and a one-rank trainer would wait for ranks that never come.
const SLURM_TASK_VARIABLES: &[&str] = &[
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "SLURM_STEP_NUM_TASKS",
];

fn start(u: &Unit, index: usize, threads: usize, owner: u32, requeues: u32) -> Result<Running> {
    // A run started before in its directory is a restart, whichever sweep started it.
    let restarts = LocalState::starts_before(&u.dir);
    let log_path = u.dir.join(LOG_FILE);
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    writeln!(
        log,
        "sweep: local job for {} ({}) started at {}, restart {restarts}",
        u.name,
        u.id,
        crate::util::now_rfc3339()
    )?;
    let job_id = u
        .record
        .last_job()
        .map(|j| j.job_id.clone())
        .unwrap_or_default();
    let launch = u.local.as_ref().map_err(|why| anyhow!("{why}"))?;
    let mut program = match launch.launcher {
        Launcher::Mpirun => super::mpirun::mpirun(launch.tasks, &["bash", "-c", &launch.line])?,
        Launcher::None | Launcher::Torchrun => {
            let mut c = Command::new("bash");
            c.args(["-c", &launch.line]);
            c
        }
        Launcher::Srun => bail!("{}: srun starts ranks on a SLURM cluster, not here", u.name),
    };
    program.envs(launch.environment("127.0.0.1", free_port()?));
    if let (Some(watch), UnitKind::Run) = (&launch.watch, u.kind) {
        program = watched(program, watch, &u.dir, &job_id)?;
    }
    ended::clear(&u.dir)?;
    let sweep = std::env::current_exe()
        .ok()
        .filter(|_| u.kind == UnitKind::Run);
    let mut cmd = recording_exit(&program, &u.dir, &job_id, sweep.as_deref());
    // The job's cores are shared among its ranks.
    let ranks = match launch.launcher {
        Launcher::None => 1,
        _ => launch.world_size.max(1),
    };
    let threads = (threads / ranks as usize).max(1);
    for v in SLURM_TASK_VARIABLES {
        cmd.env_remove(v);
    }
    // The run's share of the cores, unless `[slurm] env` says otherwise (it comes after).
    cmd.env("SWEEP_THREADS", threads.to_string())
        .env("RAYON_NUM_THREADS", threads.to_string())
        .env("OMP_NUM_THREADS", threads.to_string())
        .envs(job_env(u))
        .env("SWEEP_RESTART_COUNT", restarts.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: Ctrl-C reaches sweep only, and sweep stops each job's tree.
        .process_group(0);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", u.name))?;
    let state = LocalState {
        pid: Some(child.id()),
        pid_start: process_start(child.id()),
        started_at: Some(crate::util::now_rfc3339()),
        restarts,
        ..LocalState::new(job_id, State::Running, owner)
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

/// The program under a shell that outlives a stop signal and writes `<job id> <$?>` into
/// `exit_code`; with `sweep`, the host's fingerprint and load at both ends too.
fn recording_exit(program: &Command, dir: &Path, job_id: &str, sweep: Option<&Path>) -> Command {
    const SCRIPT: &str = r#"dir=$1 ref=$2 sweep=$3; shift 3
trap 'rc=$?; printf "%s %s\n" "$ref" "$rc" >"$dir/.exit_code.tmp" && mv -f "$dir/.exit_code.tmp" "$dir/exit_code"' EXIT
trap : INT TERM HUP
[ -z "$sweep" ] || "$sweep" fingerprint --dir "$dir" >/dev/null || echo "sweep: no environment fingerprint (why above)"
"$@"
rc=$?
[ -z "$sweep" ] || "$sweep" fingerprint --end --dir "$dir" >/dev/null 2>&1
exit $rc"#;
    let mut c = Command::new("bash");
    c.args(["-c", SCRIPT, "sweep-job"])
        .arg(dir)
        .arg(job_id)
        .arg(sweep.unwrap_or(Path::new("")));
    starting(c, program)
}

/// `c` as a wrapper starting `program`, with `program`'s environment changes.
fn starting(mut c: Command, program: &Command) -> Command {
    c.arg(program.get_program()).args(program.get_args());
    for (key, value) in program.get_envs() {
        match value {
            Some(v) => c.env(key, v),
            None => c.env_remove(key),
        };
    }
    c
}

/// The program started by `sweep watchdog`, which stops it when it stops making progress.
fn watched(program: Command, watch: &Watch, dir: &Path, job_id: &str) -> Result<Command> {
    let sweep = std::env::current_exe().context("finding the sweep binary for the watchdog")?;
    let mut c = Command::new(sweep);
    c.arg("watchdog")
        .arg("--dir")
        .arg(dir)
        .args(["--job", job_id])
        .args(watch.args())
        .arg("--");
    Ok(starting(c, &program))
}

/// A TCP port free now, for a run's `MASTER_PORT`.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .context("finding a free port for a run's MASTER_PORT")?;
    Ok(listener.local_addr()?.port())
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
    let status = to_status(s);
    let last_log_line = (status.state != State::Completed)
        .then(|| last_line(&u.dir.join(LOG_FILE)))
        .flatten();
    Outcome {
        name: u.name.clone(),
        kind: u.kind,
        status,
        seconds,
        last_log_line,
    }
}

/// The last non-empty line of a log's last 4 KiB, cut to 300 characters and made safe to print.
fn last_line(path: &Path) -> Option<String> {
    let tail = crate::util::fs::read_tail(path, 4096).ok()?;
    let tail = String::from_utf8_lossy(&tail);
    let line = tail
        .split(['\n', '\r'])
        .rev()
        .find(|l| !l.trim().is_empty())?
        .trim();
    let line = crate::util::text::without_escapes(line.into());
    Some(crate::util::text::cut(&line, 300).into_owned())
}

fn to_status(s: &LocalState) -> Status {
    Status {
        state: s.state,
        exit_code: s.exit_code,
        signal: s.signal,
        reason: s.reason.clone(),
        job_id: Some(s.job_id.clone()),
        run_s: s.run_s(),
    }
}

/// How the job's shell exited, as its `$?` (128 + N for signal N).
fn exit_status(exit: std::process::ExitStatus) -> Status {
    use std::os::unix::process::ExitStatusExt;
    match (exit.code(), exit.signal()) {
        (Some(code), _) => Status::from_shell(code),
        // The shell itself was killed (SIGKILL after the grace period).
        (None, sig) => Status {
            signal: sig,
            ..Status::new(State::Failed)
        },
    }
}

/// A local job's state: live while its process exists, else its exit status, or INTERRUPTED.
pub fn status(dir: &Path, job_id: &str) -> Status {
    let Some(s) = LocalState::load(dir) else {
        return Status::new(State::Unknown).with_reason("no local.json in the run directory");
    };
    if s.job_id != job_id {
        return Status::new(State::Unknown)
            .with_reason(format!("local.json belongs to {}, not {job_id}", s.job_id));
    }
    match s.state {
        State::Running if s.pid.is_some_and(|pid| same_process(pid, s.pid_start)) => to_status(&s),
        State::Running => ended::recorded(dir, job_id).unwrap_or_else(|| {
            if alive(s.owner_pid) {
                // Its sweep is about to record how it ended.
                to_status(&s)
            } else {
                Status::new(State::Interrupted).with_reason(
                    "ended with the sweep that ran it (stopped, killed or failed) before it recorded an exit status; `sweep run` runs it again",
                )
            }
        }),
        State::Pending if !alive(s.owner_pid) => Status::new(State::Interrupted).with_reason(
            "the sweep that queued it stopped before starting it; `sweep run` runs it",
        ),
        _ => to_status(&s),
    }
    .with_job(job_id)
}

/// The state a local job's record shows, without checking its process.
pub fn peek_state(dir: &Path) -> Option<State> {
    LocalState::load(dir).map(|s| s.state)
}

/// Stops what a job left in its process group (as SLURM does), said in the job's log.
fn stop_leftovers(pgid: u32, dir: &Path) {
    let Some(stopped) = stop_group(pgid) else {
        return;
    };
    let how = match stopped.killed {
        false => "SIGTERM",
        true => "SIGTERM, then SIGKILL 2 s later",
    };
    let pids: Vec<String> = stopped.pids.iter().map(u32::to_string).collect();
    let said = format!(
        "sweep: the job ended leaving {} process(es) of its own running (pid {}); stopped them ({how}), as SLURM does at a job's end\n",
        pids.len(),
        pids.join(", ")
    );
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(LOG_FILE));
    if let Ok(mut log) = log {
        let _ = log.write_all(said.as_bytes());
    }
}

fn cancel_requested(dir: &Path) -> bool {
    LocalState::load(dir).is_some_and(|s| s.cancel_requested)
}

/// `sweep cancel` of a local job: marked so it never (re)starts, then signalled if running.
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
