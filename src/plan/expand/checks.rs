//! What a plan accepts but says (absurd sizes, unknown devices) and the
//! runs estimated not to fit their GPU.

use super::*;

/// More nodes than the largest clusters have, or more tasks: accepted (a
/// plan may be written for a machine not yet built) but said.
pub(super) const MANY_NODES: u32 = 20_000;
pub(super) const MANY_TASKS: u64 = 200_000;

/// What the plan accepts but should say: absurd job sizes, memory estimates
/// that cannot be checked against an unknown GPU, and with `--allow-oom`
/// the runs estimated not to fit. One line per distinct cause.
pub(super) fn warnings_of(m: &Manifest, runs: &[Run], allow_oom: bool) -> Vec<String> {
    let hints = &m.hints;
    let mut out: Vec<String> = Vec::new();
    let mut say = |w: String| {
        if !out.contains(&w) {
            out.push(w);
        }
    };
    if let Some(why) = missing_figures(m) {
        say(why);
    }
    for w in missing_inputs(m, runs) {
        say(w);
    }
    for r in runs {
        let (nodes, tasks) = (r.slurm.nodes.get(), r.slurm.tasks());
        if nodes > MANY_NODES || tasks > MANY_TASKS {
            say(format!(
                "{}: {nodes} nodes and {tasks} tasks, more than any cluster has; is that a typo?",
                r.name
            ));
        }
        let Job::Train(cfg) = &r.job else { continue };
        let (logged, skip) = (cfg.logged_steps(), m.report.skip_first);
        if logged <= skip {
            let lower = match cfg.logging_frequency > 1 {
                true => "set `logging_frequency` lower, ",
                false => "set ",
            };
            say(format!(
                "runs of {} steps logged every {} log {logged} steps, and the report skips the first {skip} as warm-up: \
                 {lower}`training_steps` higher, or `[report] skip_first` below {logged}",
                cfg.training_steps, cfg.logging_frequency
            ));
        }
        if cfg.device == DeviceKind::Cuda && hints.gpu_memory_gb.is_none() {
            if let Some(gpu) = cfg
                .gpu
                .as_deref()
                .filter(|g| crate::estimate::devices::lookup(g).is_none())
            {
                say(format!(
                    "gpu `{}` is not in the device table ({}): the runs' memory is not checked; set `gpu_memory_gb` in [plan]",
                    gpu.escape_debug(),
                    crate::estimate::devices::known()
                ));
            }
        }
        if allow_oom {
            if let Some(mem) = r.memory(hints).filter(|m| m.fits == Some(false)) {
                say(format!(
                    "{} will not fit in its GPU's memory by the estimate ({})",
                    r.name,
                    mem.describe()
                ));
            }
        }
    }
    out
}

/// The files built-in trainer runs read that are not there (a stage's
/// output will be): each with its absolute path and how many runs read it.
/// A warning, not an error: a file may be made before the jobs start, or
/// exist only where they run; but a relative path read from the wrong
/// directory is the usual cause, and the message says where it was read
/// from and where it is.
fn missing_inputs(m: &Manifest, runs: &[Run]) -> Vec<String> {
    // (key, path) -> (what is wrong with it, how many runs read it)
    let mut missing: indexmap::IndexMap<(&str, &std::path::Path), (String, usize)> =
        indexmap::IndexMap::new();
    for r in runs {
        let Job::Train(cfg) = &r.job else { continue };
        let made = r.stage.is_some();
        let files = [
            ("dataset", Some(&cfg.dataset)),
            ("tokenizer", Some(&cfg.tokenizer)),
            (
                "pretokenized_path",
                cfg.pretokenized_path
                    .as_ref()
                    .filter(|_| cfg.pretokenized && !made),
            ),
        ];
        for (key, path) in files {
            let Some(path) = path.filter(|p| !p.as_os_str().is_empty()) else {
                continue;
            };
            let wrong = match std::fs::metadata(path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_string(),
                Ok(meta) if !meta.is_file() => format!(
                    "is {}, not a regular file",
                    crate::util::fs::kind_of(meta.file_type())
                ),
                _ => continue,
            };
            missing.entry((key, path.as_path())).or_insert((wrong, 0)).1 += 1;
        }
    }
    missing
        .into_iter()
        .map(|((key, path), (wrong, n))| {
            // Where a missing relative path might be meant to be read from.
            let relative = path
                .strip_prefix(&m.root)
                .ok()
                .filter(|_| !path.exists());
            let found = relative.and_then(|rel| {
                let dir = m.path.parent()?.canonicalize().ok()?;
                dir.ancestors().find(|d| d.join(rel).exists()).map(|d| d.to_path_buf())
            });
            let hint = match (relative, found) {
                (Some(_), Some(d)) => format!(
                    ": relative paths are read from the project root {} (the working directory, or -C), and {} has it: run sweep there or give `-C {}`",
                    m.root.display(),
                    d.display(),
                    d.display()
                ),
                (Some(_), None) => format!(
                    ": relative paths are read from the project root {} (the working directory, or -C)",
                    m.root.display()
                ),
                (None, _) => String::new(),
            };
            format!("`{key}` {} {wrong} ({n} run(s) read it){hint}", path.display())
        })
        .collect()
}

/// Axes of a command study that no template reads (the command, the run
/// name, a derived value, `[report] tokens_per_step`): their runs run the
/// same command, measured as if they differed.
pub(super) fn unused_axes(m: &Manifest, engine: &crate::template::Engine) -> Vec<String> {
    let Mode::Command(command) = &m.mode else {
        return Vec::new();
    };
    let mut templates: Vec<&str> = vec![command];
    templates.extend(m.name_template.as_deref());
    templates.extend(m.derived.iter().map(|d| d.expr.as_str()));
    templates.extend(m.report.tokens_per_step.as_ref().and_then(|t| t.expr()));
    let mut out = Vec::new();
    for key in m.axes.iter().flat_map(|a| &a.keys) {
        let top = key.split('.').next().unwrap_or(key);
        // `[slurm]` keys shape the job; `launcher` starts it.
        if top == "slurm" || key == "launcher" || key == REPEAT {
            continue;
        }
        if !templates.iter().any(|t| engine.uses(t, top)) {
            out.push(format!(
                "`{key}` is swept, and the command never reads it (nor the run name, a derived value or tokens_per_step): its runs run the same command"
            ));
        }
    }
    out
}

/// A command study without a line pattern (its report would have no
/// figures, and the watchdog nothing to watch), or with a baseline whose
/// line pattern yields no tokens/s (no speedups, nothing for `sweep check`).
fn missing_figures(m: &Manifest) -> Option<String> {
    let Mode::Command(_) = &m.mode else {
        return None;
    };
    let Some(pattern) = &m.report.line_pattern else {
        return Some(
            "`[report] line_pattern` is not set: nothing reads the command's log, so its runs have figures \
             (tokens/s, loss) only where the command writes `metrics.jsonl` in its run directory, and the watchdog \
             cannot tell a run that stopped making progress. Give the regex of its progress lines (docs/report.md)"
                .into(),
        );
    };
    let Some(baseline) = &m.report.baseline else {
        return None;
    };
    let re = crate::util::text::regex(pattern).ok()?;
    let groups: Vec<&str> = re.capture_names().flatten().collect();
    let r = &m.report;
    let timed = r.step_time.is_some() || groups.contains(&"step_time_s");
    let tokens = groups.contains(&"tokens_per_second")
        || r.throughput.is_some()
        || (timed && r.tokens_per_step.is_some());
    (!tokens).then(|| format!(
        "[report] baseline = \"{}\", and its line_pattern yields no tokens/s: the report will have no speedups. \
         Name a `tokens_per_second` group, say which group is tokens/s (`throughput`), or give a step's time \
         (`step_time`) and `tokens_per_step`",
        baseline.escape_debug()
    ))
}

/// Runs whose estimated peak memory exceeds their GPU's are an error (before
/// anything waits in a queue to die), listed together.
pub(super) fn check_memory(m: &Manifest, runs: &[Run]) -> Result<(), Diagnostics> {
    let over: Vec<(&Run, crate::plan::Memory)> = runs
        .iter()
        .filter_map(|r| Some((r, r.memory(&m.hints)?)))
        .filter(|(_, mem)| mem.fits == Some(false))
        .collect();
    let Some((_, first)) = over.first() else {
        return Ok(());
    };
    let shown: Vec<String> = over
        .iter()
        .take(5)
        .map(|(r, mem)| format!("{} ({})", r.name, mem.describe()))
        .collect();
    let more = match over.len() {
        n if n > 5 => format!(" and {} more", n - 5),
        _ => String::new(),
    };
    // Recomputation first where it is off and activations weigh.
    let (first_run, _) = over[0];
    let recompute = match &first_run.job {
        Job::Train(cfg)
            if cfg.recompute == crate::config::Recompute::None
                && first.parts.activations * 5 > first.parts.total() =>
        {
            "`recompute = \"blocks\"`, "
        }
        _ => "",
    };
    let mut d = m.locate("batch_size");
    d.message = format!(
        "{} run(s) will not fit in their GPU's memory by the estimate: {}{more}",
        over.len(),
        shown.join(", ")
    );
    d.help = Some(format!(
        "try {recompute}a smaller `batch_size` or more GPUs; set `gpu_memory_gb` in [plan] if your GPUs have more memory than the table says; \
         `--allow-oom` plans them anyway (docs/memory.md)"
    ));
    Err(d.into())
}
