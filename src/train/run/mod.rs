//! `sweep train --config <run>/config.toml`: what every sweep run executes. Resolves
//! `batch_size = "max"`, builds the [`Trainer`], resumes from the latest checkpoint and trains
//! to the last step. A stop signal ends the step, checkpoints and exits with [`REQUEUE_EXIT`];
//! a device out of memory exits with [`OUT_OF_MEMORY_EXIT`]. Rank 0 holds the run's lock and
//! alone writes metrics and checkpoints; every rank trains its slice of each batch ([`dist`]).

mod checkpoint;
pub mod dist;
pub mod energy;
pub mod max_batch;
pub mod metrics;
mod monitor;
pub mod peak;
pub mod record;
mod schedule;
mod stacks;
mod trainer;

pub use trainer::{StepOutcome, Trainer};

use self::metrics::{LoggedStep, Reporter};
use self::monitor::Monitor;
use self::record::MetricsLog;
use self::trainer::Interrupted;
use crate::config::{BatchSize, RuntimeOptions, TrainConfig, OUT_OF_MEMORY_EXIT, REQUEUE_EXIT};
use crate::data::{DataLoader, SampleStream};
use crate::train::network::{device, optim};
use crate::util::heartbeat::Heartbeat;
use crate::util::signals::{ExitUntilDropped, StopSignals};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// `sweep train`: the exit code says how it ended (0, [`REQUEUE_EXIT`], [`OUT_OF_MEMORY_EXIT`]).
pub fn run(config: &Path, rt: &RuntimeOptions) -> Result<ExitCode> {
    match run_to_end(config, rt) {
        Err(e) if device::is_out_of_memory(&e) => {
            eprintln!("error: {e:#}");
            eprintln!("sweep train: the device ran out of memory (exit {OUT_OF_MEMORY_EXIT})");
            Ok(ExitCode::from(OUT_OF_MEMORY_EXIT as u8))
        }
        other => other,
    }
}

/// How long a trainer waits for another of its run to exit (a requeued job's old instance).
pub const TRAIN_LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

fn run_to_end(config: &Path, rt: &RuntimeOptions) -> Result<ExitCode> {
    let run_dir = crate::util::fs::parent_dir(config).to_path_buf();
    let mut cfg = TrainConfig::load(config)?;
    let _lock = match dist::Ranks::from_env()?.is_main() {
        true => Some(lock_run(&run_dir)?),
        false => None,
    };
    let starting = Stop::while_starting()?;
    if cfg.batch_size == BatchSize::Max {
        // A stop ends the search's trial too (its process group).
        cfg.batch_size = BatchSize::Fixed(max_batch::resolve(&cfg, &run_dir)?);
    }
    let threads = init_threads(cfg.threads, rt);
    let stop = Stop::install()?;
    let mut t = Trainer::new(cfg, threads, rt)?;
    let result = train(&mut t, &run_dir, (&stop, starting), rt.check_replicas);
    if let Err(e) = &result {
        let r = t.ranks();
        if r.world_size > 1 {
            // The other ranks are waiting in a collective: stop them all.
            eprintln!(
                "sweep train: rank {} of {} failed: {e:#}; stopping every rank",
                r.rank, r.world_size
            );
            t.comm.abort(1);
        }
    }
    result
}

/// The run directory's lock, for as long as this trainer lives.
fn lock_run(run_dir: &Path) -> Result<crate::util::lock::DirLock> {
    let what = format!(
        "sweep train, job {}",
        std::env::var("SLURM_JOB_ID").unwrap_or("-".into())
    );
    let waiting = |holder: &str| {
        eprintln!(
            "sweep train: this run is being trained by {holder}; waiting up to {} s for it to end",
            TRAIN_LOCK_PATIENCE.as_secs()
        )
    };
    let (lock, _) = crate::util::lock::DirLock::run(run_dir, &what, waiting, TRAIN_LOCK_PATIENCE)
        .context("the run's lock (held by its trainer: no second one may write the same log and checkpoints)")?;
    Ok(lock)
}

/// The threads for the CPU kernels, set from the training thread, one of the pool's (as OpenMP's
/// main thread: no hand-off per op; docs/performance.md).
pub fn init_threads(configured: usize, rt: &RuntimeOptions) -> usize {
    let n = rt.threads(configured);
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .use_current_thread()
        // Room for a fault's report (util::crash) on the compute threads.
        .start_handler(|_| crate::util::crash::roomy_signal_stack())
        .build_global();
    n
}

/// The stop signals as they arrive; a second does not end the process (it may be checkpointing).
struct Stop(StopSignals);

impl Stop {
    const SIGNALS: [i32; 4] = {
        use crate::util::signals::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
        [SIGUSR1, SIGTERM, SIGINT, SIGHUP]
    };

    fn install() -> Result<Stop> {
        Ok(Stop(StopSignals::install(&Self::SIGNALS)?))
    }

    /// Until the guard is dropped, a stop ends the trainer at once: starting writes nothing.
    fn while_starting() -> Result<ExitUntilDropped> {
        ExitUntilDropped::install(&Self::SIGNALS, REQUEUE_EXIT, |sig| {
            format!(
                "sweep train: {} received while the run was starting (model, data, checkpoint); no step was begun; exiting to be requeued",
                crate::util::signals::name(sig)
            )
        })
    }

    /// The last signal received since the last call, by name.
    fn take(&self) -> Option<&'static str> {
        self.0.take().map(crate::util::signals::name)
    }
}

/// Says what is being trained, where, and against what peak.
fn announce(t: &Trainer, cfg: &TrainConfig, flops_per_token: f64, peak: f64, peak_source: &str) {
    let ranks = t.ranks();
    eprintln!(
        "sweep train: {} ({} parameters, {:.1} MFLOP/token) on {} with {} threads; peak {:.1} GFLOP/s ({peak_source})",
        cfg.model,
        t.params.count(),
        flops_per_token / 1e6,
        if t.device.is_cpu() { "cpu" } else { "cuda" },
        t.threads,
        peak / 1e9
    );
    if !t.comm.is_single() {
        eprintln!(
            "sweep train: {} rank(s), gradients summed by {} {}; global batch {}",
            ranks.world_size,
            t.comm.describe(),
            if t.comm.overlaps() {
                "during the backward pass"
            } else {
                "after the backward pass"
            },
            ranks.world_size * cfg.batch() * cfg.gradient_accumulation
        );
    }
}

/// Where a rank starts: step 1, or the step after its latest checkpoint.
struct Start {
    /// The first step to train.
    first: usize,
    /// Seconds of training before it.
    elapsed: f64,
    /// The data stream, at the position of the step before `first`.
    stream: SampleStream,
    /// That position (`None` before step 1), for a stop before the first step.
    position: Option<crate::data::LoaderState>,
    monitor: Monitor,
}

/// Opens the data and restores the latest checkpoint, with the accumulation for this world size.
fn resume(t: &mut Trainer, run_dir: &Path) -> Result<Start> {
    let mut start = Start {
        first: 1,
        elapsed: 0.0,
        stream: SampleStream::open(&t.spec)?,
        position: None,
        monitor: Monitor::new(t.cfg.monitor.clone(), t.cfg.grad_clip),
    };
    let Some((dir, state)) = resume_point(t, run_dir)? else {
        return Ok(start);
    };
    let cfg = &t.cfg;
    state.check(&model_identity(t), cfg.training_steps, &dir)?;
    let resume = state.resume(
        t.ranks(),
        cfg.data_order,
        cfg.batch(),
        cfg.gradient_accumulation,
        &dir,
    )?;
    checkpoint::restore(&dir, &state, &t.params, t.opt.adamw_mut(), &t.device)?;
    if let trainer::Optimizer::Sharded(z) = &mut t.opt {
        z.refresh(&t.params)?;
    }
    start.stream.restore(resume.loader)?;
    start.monitor.state = state.monitor.clone();
    t.cfg.gradient_accumulation = resume.gradient_accumulation;
    if t.ranks().is_main() {
        eprintln!(
            "sweep train: resumed from {} (step {}, global sample {}{})",
            dir.display(),
            state.step,
            state.loader.samples,
            resume.change.map(|c| format!("; {c}")).unwrap_or_default()
        );
    }
    start.first = state.step + 1;
    start.elapsed = state.elapsed_s;
    start.position = Some(state.loader);
    Ok(start)
}

/// The device's peak FLOP/s and where it comes from (a CPU's is measured on first use).
fn peak_flops(t: &Trainer) -> Result<(f64, String)> {
    let driver_name = (!t.device.is_cpu())
        .then(|| device::name(&t.device))
        .transpose()?;
    metrics::peak_flops(&t.cfg, driver_name.as_deref(), t.threads)
}

/// The counters and the metrics log (rank 0 writes it).
fn open_reporter(
    t: &Trainer,
    run_dir: &Path,
    first: usize,
    (peak, peak_source): (f64, String),
) -> Result<Reporter> {
    let (cfg, main) = (&t.cfg, t.ranks().is_main());
    let flops_per_token = t.model_spec.cfg.flops_per_token(cfg.sequence_length);
    if main {
        announce(t, cfg, flops_per_token, peak, &peak_source);
    }
    let log = main.then(|| MetricsLog::open(run_dir)).transpose()?;
    let mut reporter = Reporter::new(
        log,
        cfg,
        t.ranks().world_size,
        flops_per_token,
        peak,
        peak_source,
    )
    .with_meter(main.then(|| energy::open(&t.device)).flatten());
    if first > 1 {
        reporter.resume(first - 1)?;
    }
    reporter.device_opened(first, &t.fallbacks, &t.kernel_timings)?;
    reporter.f32_products(first, t.f32_products)?;
    if t.ranks().world_size > 1 {
        let hosts = dist::gather_hosts(&*t.comm, &t.device)?;
        reporter.placement(first, hosts)?;
    }
    Ok(reporter)
}

/// Under a watchdog: this rank's progress after each step, its stacks on request.
fn watched(t: &Trainer, run_dir: &Path) -> Result<Option<Heartbeat>> {
    let beat = Heartbeat::open(run_dir, t.ranks().rank);
    self::stacks::install(run_dir, t.ranks().rank)?;
    Ok(beat)
}

/// Whether every rank stops after this step (all at the same step, even when a signal reached
/// only some), and the signal that reached this one.
fn agree_to_stop(t: &Trainer, stop: &Stop) -> Result<(bool, Option<&'static str>)> {
    let signal = stop.take();
    let [stopping] = dist::sum_scalars(&*t.comm, [signal.is_some() as u8 as f64], &t.device)?;
    Ok((stopping > 0.0, signal))
}

/// The training loop of one rank, from the latest checkpoint to the last step.
fn train(
    t: &mut Trainer,
    run_dir: &Path,
    (stop, starting): (&Stop, ExitUntilDropped),
    check_every_step: bool,
) -> Result<ExitCode> {
    let Start {
        first,
        mut elapsed,
        stream,
        mut position,
        mut monitor,
    } = resume(t, run_dir)?;
    let peak = peak_flops(t)?;
    // From here on the trainer writes its log: a stop is taken between steps.
    drop(starting);
    // What the trainer trains with, resumed; the loop only reads it.
    let cfg = t.cfg.clone();
    let main = t.ranks().is_main();
    let mut beat = watched(t, run_dir)?;
    let mut reporter = open_reporter(t, run_dir, first, peak)?;
    let mut loader = DataLoader::spawn(stream, cfg.batch(), cfg.prefetch);
    let tokens_per_step = (cfg.batch() * cfg.sequence_length * cfg.gradient_accumulation) as u64;
    let schedule = schedule::Schedule::new(&cfg);
    let mut memory = device::PeakMemory::default();
    let mut saved = first - 1;
    // One rank stops between micro-batches; several agree at a step's end (a rank leaving mid-step
    // would leave the others waiting in the gradient sum).
    let stop_early = (t.ranks().world_size == 1).then_some(&stop.0);

    for step in first..=cfg.training_steps {
        let started = Instant::now();
        let lr = optim::lr_at(step, &cfg);
        let Some((micro, out)) = step_or_stop(t, &mut loader, (step, lr), &mut memory, stop_early)?
        else {
            let why = stop.take().unwrap_or("a stop signal");
            return stop_mid_step(
                t,
                &cfg,
                run_dir,
                (step, saved),
                position.as_ref(),
                &monitor,
                elapsed,
                why,
            );
        };
        let step_time = started.elapsed().as_secs_f64();
        if let Some(b) = beat.as_mut() {
            b.beat(step as u64);
        }
        elapsed += step_time;
        position = micro.last().map(|b| b.state.clone());
        reporter.count(
            tokens_per_step,
            out.training_tokens as u64,
            step_time,
            out.comm_s,
        );
        if check_every_step {
            t.check_replicas()
                .with_context(|| format!("after step {step}"))?;
        }
        reporter.events(step, monitor.observe(step, out.loss, out.grad_norm))?;
        let due = schedule.at(step);
        if due.log {
            // Only the rank that writes the log validates.
            let val_loss = (due.validate && main)
                .then(|| t.validation_loss(cfg.validation_batches))
                .transpose()?;
            reporter.log(LoggedStep {
                step,
                loss: out.loss,
                lr,
                grad_norm: out.grad_norm,
                elapsed_s: elapsed,
                peak_memory_mb: memory.peak_mb(&t.device),
                val_loss,
                rank_compute_s: rank_compute_times(t, &reporter)?,
            })?;
        }

        let (stopping, signal) = agree_to_stop(t, stop)?;
        if due.checkpoint || stopping {
            let at = position.as_ref().expect("a step read its micro-batches");
            let dir = save_checkpoint(t, &cfg, run_dir, step, at, &monitor, elapsed)?;
            saved = step;
            if stopping {
                if main {
                    let why = signal.unwrap_or("a stop signal (on another rank)");
                    eprintln!("sweep train: {why} received; checkpoint {} written at step {step}; exiting to be requeued", dir.display());
                }
                return Ok(ExitCode::from(REQUEUE_EXIT as u8));
            }
        }
    }
    finish(t, elapsed)
}

/// Step `step` at `lr` over the next micro-batches, with its outcome; `None` where a stop
/// signal interrupted it.
fn step_or_stop(
    t: &mut Trainer,
    loader: &mut DataLoader,
    (step, lr): (usize, f64),
    memory: &mut device::PeakMemory,
    stop_early: Option<&StopSignals>,
) -> Result<Option<(Vec<crate::data::Batch>, self::trainer::StepOutcome)>> {
    let count = t.cfg.gradient_accumulation;
    let mut micro = Vec::with_capacity(count);
    while micro.len() < count && stop_early.is_none_or(|s| s.received().is_none()) {
        micro.push(loader.next_batch()?);
    }
    if micro.len() < count {
        return Ok(None);
    }
    match t.step(&micro, lr, memory, stop_early) {
        Err(e) if e.is::<Interrupted>() => Ok(None),
        other => Ok(Some((
            micro,
            other.with_context(|| format!("step {step}"))?,
        ))),
    }
}

/// Each rank's compute time so far, gathered (every rank calls it at the same step).
fn rank_compute_times(t: &Trainer, reporter: &Reporter) -> Result<Vec<f64>> {
    if t.ranks().world_size > 1 {
        dist::gather_scalar(&*t.comm, reporter.compute_s(), &t.device)
    } else {
        Ok(Vec::new())
    }
}

/// After the last step: every rank holds the same parameters (checked); the run is done.
fn finish(t: &Trainer, elapsed: f64) -> Result<ExitCode> {
    let ranks = t.ranks();
    if ranks.world_size > 1 {
        let digest = t.check_replicas()?;
        if ranks.is_main() {
            eprintln!(
                "sweep train: parameters identical on all {} ranks (sha256 {})",
                ranks.world_size,
                &digest[..16]
            );
        }
    }
    if ranks.is_main() {
        let b = t.state_bytes();
        eprintln!(
            "sweep train: rank 0 keeps {} B of parameters, {} B of gradient buffers, {} B of gradient sums, \
             {} B of master values and {} B of moments (zero = {})",
            b.params, b.grads, b.grad_sums, b.master, b.moments, t.cfg.zero
        );
        eprintln!(
            "sweep train: done, {} steps in {elapsed:.1} s of training",
            t.cfg.training_steps
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A stop between a step's micro-batches (one rank): the step is abandoned, the last completed
/// one checkpointed unless saved, and the run exits to be started again.
#[allow(clippy::too_many_arguments)]
fn stop_mid_step(
    t: &Trainer,
    cfg: &TrainConfig,
    run_dir: &Path,
    (step, saved): (usize, usize),
    position: Option<&crate::data::LoaderState>,
    monitor: &Monitor,
    elapsed: f64,
    why: &str,
) -> Result<ExitCode> {
    let done = step - 1;
    let note = match position {
        Some(at) if done > saved => {
            let dir = save_checkpoint(t, cfg, run_dir, done, at, monitor, elapsed)?;
            format!("checkpoint {} written at step {done}", dir.display())
        }
        _ if done > 0 => format!("step {done} is checkpointed already"),
        _ => "no step was completed".to_string(),
    };
    eprintln!("sweep train: {why} received during step {step}; {note}; exiting to be requeued");
    Ok(ExitCode::from(REQUEUE_EXIT as u8))
}

/// The model this run trains, as its checkpoints record it.
fn model_identity(t: &Trainer) -> checkpoint::ModelIdentity {
    checkpoint::ModelIdentity {
        preset: t.cfg.model.clone(),
        shape: t.model_spec.cfg.clone(),
    }
}

/// The checkpoint every rank resumes from: the newest whole one as the first rank finds it
/// (saying which newer ones it skipped, and why).
fn resume_point(t: &Trainer, run_dir: &Path) -> Result<Option<(PathBuf, checkpoint::TrainState)>> {
    let ranks = t.ranks();
    let chosen = if ranks.is_main() {
        checkpoint::remove_partial(run_dir);
        let (found, skipped) = checkpoint::latest(run_dir);
        for s in &skipped {
            eprintln!(
                "sweep train: checkpoint {} skipped: {}",
                s.dir.display(),
                s.why
            );
        }
        match (&found, skipped.is_empty()) {
            (Some((dir, _)), false) => eprintln!(
                "sweep train: resuming from the newest whole checkpoint, {}",
                dir.display()
            ),
            (None, false) => {
                eprintln!("sweep train: no whole checkpoint is left; starting from step 1")
            }
            _ => {}
        }
        found
    } else {
        None
    };
    if ranks.world_size == 1 {
        return Ok(chosen);
    }
    // Its step + 1 (0: none), from the first rank to all: exact in an f64.
    let mine = chosen.as_ref().map_or(0.0, |(_, s)| s.step as f64 + 1.0);
    let [step] = dist::sum_scalars(&*t.comm, [mine], &t.device)?;
    match (chosen, step as usize) {
        (Some(c), _) => Ok(Some(c)),
        (None, 0) => Ok(None),
        (None, s) => checkpoint::at_step(run_dir, s - 1).map(Some),
    }
}

/// A checkpoint after `step`: parameters, optimizer state, data position and the monitor's
/// window; with several ranks, after checking they hold the same parameters.
fn save_checkpoint(
    t: &Trainer,
    cfg: &TrainConfig,
    run_dir: &Path,
    step: usize,
    position: &crate::data::LoaderState,
    monitor: &Monitor,
    elapsed_s: f64,
) -> Result<PathBuf> {
    let ranks = t.ranks();
    let state = checkpoint::TrainState {
        step,
        optimizer_steps: t.opt.adamw().t,
        loader: position.clone(),
        world_size: ranks.world_size,
        other_ranks: Vec::new(),
        data_order: cfg.data_order,
        global_batch: ranks
            .world_size
            .checked_mul(cfg.batch())
            .and_then(|b| b.checked_mul(cfg.gradient_accumulation))
            .context("the global batch overflows")?,
        model: Some(model_identity(t)),
        monitor: monitor.state.clone(),
        elapsed_s,
        sweep_version: env!("CARGO_PKG_VERSION").into(),
        // Set by the save, which knows who wrote what.
        optimizer_shards: 0,
    };
    if ranks.world_size > 1 {
        t.check_replicas()
            .with_context(|| format!("checkpoint at step {step}"))?;
    }
    let sharded = matches!(t.opt, trainer::Optimizer::Sharded(_));
    let opt = (t.opt.adamw(), sharded);
    checkpoint::save_all_ranks(run_dir, &t.params, opt, state, &*t.comm, &t.device)
}
