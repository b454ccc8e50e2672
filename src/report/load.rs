//! Reading a study: a manifest's planned runs, a results directory or imported logs, each run
//! with its state, record and points, and the report settings that come with them.

use super::{flops, ingest, page, summary};
use crate::executor::{self, State, Status};
use crate::manifest::{Mode, ReportSpec};
use crate::plan::record::{RunRecord, StudyRecord, UnitKind};
use crate::plan::Plan;
use anyhow::{bail, Context, Result};
use ingest::RunLog;
use rayon::prelude::*;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Our trainer's metrics.jsonl.
    Jsonl,
    /// The reference study's `Step: N | Loss: ... | Tokens per second: ...` lines.
    Reference,
    /// Lines matched by `--pattern` (a regex with named groups).
    Pattern,
}

/// Where the runs come from.
pub enum Source {
    /// A manifest's plan: it names the runs and their directories.
    Plan(Box<Plan>),
    /// `results/<study>`: every run directory in it.
    ResultsDir(PathBuf),
    /// Files matching a glob, one run each.
    Import {
        glob: String,
        format: LogFormat,
        /// `--pattern` and what its groups mean, as a command study's `[report]` says.
        report: Box<ReportSpec>,
        name: String,
    },
}

/// A results directory's study name (one plain name: it names `plots/<study>`).
pub(crate) fn dir_study_name(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .map_or_else(|| "study".into(), |n| crate::util::name::sanitize(&n))
}

/// Report settings a manifest may carry, and what the page says of it.
#[derive(Default)]
pub(crate) struct Spec {
    pub(crate) axes: Option<Vec<String>>,
    pub(crate) skip_first: Option<usize>,
    pub(crate) baseline: Option<String>,
    pub(crate) group_by: Vec<String>,
    pub(crate) provenance: page::Provenance,
    /// Log files named by the user (`--import`): no output may replace one.
    pub(crate) inputs: Vec<PathBuf>,
    /// Run directories left by an earlier manifest: problems, never averaged in.
    pub(crate) stale: Vec<summary::Problem>,
    /// The foreign log fields the line pattern names (`Point::extra`).
    pub(crate) extras: Vec<String>,
    /// Those of them charted.
    pub(crate) charts: Vec<String>,
    /// The study's canonical directory, where it has one (its history is beside it).
    pub(crate) dir: Option<PathBuf>,
}

impl Spec {
    /// Log points skipped per run: the flag's, else the manifest's, else the default.
    pub(crate) fn skip_first(&self, flag: Option<usize>) -> usize {
        flag.or(self.skip_first)
            .unwrap_or(crate::manifest::DEFAULT_SKIP_FIRST)
    }
}

pub(crate) fn load(source: &Source) -> Result<(String, Vec<RunLog>, Spec)> {
    match source {
        Source::Plan(plan) => load_planned(plan),
        Source::ResultsDir(dir) => load_results_dir(dir),
        Source::Import {
            glob,
            format,
            report,
            name,
        } => load_imported(glob, *format, report, name),
    }
}

/// Log files a user names, one run each, read as `report` says.
fn load_imported(
    glob: &str,
    format: LogFormat,
    report: &ReportSpec,
    name: &str,
) -> Result<(String, Vec<RunLog>, Spec)> {
    crate::util::name::check(name).map_err(|why| anyhow::anyhow!("--name: {why}"))?;
    if let Some(f) = report
        .faults()
        .into_iter()
        .chain(report.collisions(&[]))
        .next()
    {
        // `charts[1]` is `--charts`; the line pattern is `--pattern`.
        let flag = match f.key.split('[').next().unwrap_or_default() {
            "line_pattern" => "pattern".to_string(),
            key => key.replace('_', "-"),
        };
        match f.help {
            Some(help) => bail!("--{flag}: {} ({help})", f.why),
            None => bail!("--{flag}: {}", f.why),
        }
    }
    let pattern = command_pattern(report)
        .map_err(|e| anyhow::anyhow!("--pattern is not a valid regular expression: {e}"))?;
    let (mut runs, inputs) = load_import(glob, format, pattern.as_ref())?;
    let tokens = report.tokens_per_step.as_ref().and_then(|t| t.number());
    for run in &mut runs {
        if let Some(t) = tokens {
            run.params
                .insert(crate::manifest::TOKENS_PER_STEP.into(), t.into());
        }
        flops::derive(run, report);
    }
    let spec = Spec {
        inputs,
        extras: pattern.map(|p| p.extras).unwrap_or_default(),
        charts: report.charts.clone(),
        ..Spec::default()
    };
    Ok((name.to_string(), runs, spec))
}

/// The runs a manifest plans, read from their directories.
fn load_planned(plan: &Plan) -> Result<(String, Vec<RunLog>, Spec)> {
    let states = planned_states(plan);
    let rs = &plan.manifest.report;
    let pattern = match &plan.manifest.mode {
        Mode::Command(_) => command_pattern(rs)?,
        Mode::Train(_) => None,
    };
    let figures = Figures::of(matches!(plan.manifest.mode, Mode::Command(_)), &pattern);
    let runs = plan
        .runs
        .par_iter()
        .zip(states)
        .map(|(r, (st, record))| {
            let mut run = match &record {
                Some(_) => read_run(&r.name, &r.dir, &plan.study_dir, st, figures),
                // Whatever the directory holds is not this run's.
                None => RunLog {
                    reason: st.reason.clone(),
                    ..RunLog::new(&r.name, st)
                },
            };
            run.identity = Some(r.identity.clone());
            if let Some(rec) = &record {
                (run.id, run.attempt) = (Some(r.id.clone()), rec.attempt);
            }
            run.block = r.block;
            environment(&mut run);
            run.built = record.map(|rec| ingest::Built::of(&rec));
            run.params = r.params.clone();
            run.configuration = Some(r.configuration.clone());
            if let crate::plan::Job::Command(_) = r.job {
                flops::derive(&mut run, rs);
            }
            run.forecast_pct = match (&r.job, r.world_size()) {
                (crate::plan::Job::Train(_), 1) => Some(100.0),
                _ => r.scaling(&plan.manifest.hints).map(|f| f.efficiency_pct),
            };
            run
        })
        .collect();
    let m = &plan.manifest;
    let spec = Spec {
        axes: Some(m.axis_keys().map(str::to_string).collect()),
        skip_first: Some(rs.skip_first),
        baseline: rs.baseline.clone(),
        group_by: rs.group_by.clone(),
        provenance: page::Provenance {
            description: m.description.clone(),
            manifest: Some((m.path.clone(), m.source.text.clone())),
            devices: devices(plan),
            ..page::Provenance::default()
        },
        inputs: Vec::new(),
        stale: Vec::new(),
        extras: pattern.map(|p| p.extras).unwrap_or_default(),
        charts: rs.charts.clone(),
        dir: plan.study_dir.canonicalize().ok(),
    };
    Ok((plan.manifest.name.clone(), runs, spec))
}

/// How a command study's logs are read: `[report] line_pattern` with its roles, or `metrics.jsonl`.
pub(super) fn command_pattern(
    rs: &crate::manifest::ReportSpec,
) -> Result<Option<ingest::pattern::Pattern>> {
    rs.line_pattern
        .as_deref()
        .map(|p| ingest::pattern::Pattern::new(p, &rs.roles()).map_err(anyhow::Error::msg))
        .transpose()
}

/// Each planned run's state from `run.json`, and its record where the files are that run's.
fn planned_states(plan: &Plan) -> Vec<(Status, Option<RunRecord>)> {
    use executor::State;
    let loaded: Vec<Result<RunRecord, Status>> = plan
        .runs
        .iter()
        .map(|r| match RunRecord::load_within(&r.dir, &plan.study_dir) {
            Ok(Some(rec)) if rec.id == r.id => Ok(rec),
            Ok(Some(rec)) => Err(Status::new(State::Unknown).with_reason(format!(
                "its directory holds run {} of another version of the manifest: `sweep render` it again",
                rec.id
            ))),
            Ok(None) => Err(Status::new(State::Unsubmitted)
                .with_reason("not rendered yet: `sweep render` or `sweep run` it")),
            Err(e) => Err(Status::new(State::Unknown).with_reason(format!("{e:#}"))),
        })
        .collect();
    let records: Vec<(&RunRecord, &Path)> = loaded
        .iter()
        .zip(&plan.runs)
        .filter_map(|(rec, r)| Some((rec.as_ref().ok()?, r.dir.as_path())))
        .collect();
    let mut known = states_or_unknown(&records).into_iter();
    loaded
        .into_iter()
        .map(|rec| match rec {
            Ok(rec) => (known.next().expect("a state per record"), Some(rec)),
            Err(status) => (status, None),
        })
        .collect()
}

/// Where a plan's runs train: `cpu`, `cuda (H100)`, with the SLURM partition when named.
fn devices(plan: &Plan) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in &plan.runs {
        let device = match &r.job {
            crate::plan::Job::Train(cfg) => match (cfg.device, &cfg.gpu) {
                (crate::config::DeviceKind::Cpu, _) => "cpu".to_string(),
                (crate::config::DeviceKind::Cuda, Some(g)) => format!("cuda ({g})"),
                (crate::config::DeviceKind::Cuda, None) => "cuda".to_string(),
            },
            crate::plan::Job::Command(_) => "a command's own devices".to_string(),
        };
        let d = match &r.slurm.partition {
            Some(p) => format!("{device}, partition {p}"),
            None => device,
        };
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// Every run directory of `results/<study>`; one whose record cannot be read is a problem.
fn load_results_dir(dir: &Path) -> Result<(String, Vec<RunLog>, Spec)> {
    let study = dir_study_name(dir);
    let (mut found, mut broken) = run_dirs(dir)?;
    // The manifest that last rendered the directory says which runs are its own.
    let record = StudyRecord::load(dir)?;
    // Logs without a record count only in a study's directory: `/`, with `/tmp`'s logs, is none.
    if found.is_empty() && (broken.is_empty() || record.is_none()) {
        bail!(
            "{} holds no run directories (run.json){}; give the manifest or `sweep render` first",
            dir.display(),
            match record {
                Some(_) => "",
                None => " and no study.json: it is not a study's results directory",
            }
        );
    }
    let stale = match &record {
        Some(rec) => keep_current(&mut found, rec),
        None => Vec::new(),
    };
    found.sort_by(|a, b| {
        a.0.created_at
            .cmp(&b.0.created_at)
            .then(a.0.name.cmp(&b.0.name))
    });
    let records: Vec<(&RunRecord, &Path)> = found.iter().map(|(r, d)| (r, d.as_path())).collect();
    let states = states_or_unknown(&records);
    // A command study's logs are read as its manifest said.
    let command = record.as_ref().and_then(|r| r.command_report.clone());
    let pattern = match &command {
        Some(rs) => command_pattern(rs)?,
        None => None,
    };
    let figures = Figures::of(command.is_some(), &pattern);
    let mut runs: Vec<RunLog> = found
        .par_iter()
        .zip(states)
        .map(|((r, d), st)| {
            let mut run = read_run(&r.name, d, dir, st, figures);
            run.identity = r.identity.clone();
            (run.id, run.attempt) = (Some(r.id.clone()), r.attempt);
            run.block = r.block;
            environment(&mut run);
            run.built = Some(ingest::Built::of(r));
            run.params = r.params.clone();
            run.configuration = r.configuration.clone();
            if let Some(rs) = &command {
                flops::derive(&mut run, rs);
            }
            run
        })
        .collect();
    broken.sort_by(|a, b| a.name.cmp(&b.name));
    runs.extend(broken);
    let spec = match record {
        Some(rec) => Spec {
            axes: Some(rec.axes),
            skip_first: Some(rec.skip_first),
            baseline: rec.baseline,
            group_by: rec.group_by,
            stale,
            extras: pattern.map(|p| p.extras).unwrap_or_default(),
            charts: command.map(|rs| rs.charts).unwrap_or_default(),
            ..Spec::default()
        },
        None => Spec::default(),
    };
    let spec = Spec {
        dir: dir.canonicalize().ok(),
        ..spec
    };
    Ok((study, runs, spec))
}

/// A run directory found, with its record.
type Found = (RunRecord, PathBuf);

/// A results directory's run directories with their records, and runs that say why not.
fn run_dirs(dir: &Path) -> Result<(Vec<Found>, Vec<RunLog>)> {
    let mut found: Vec<Found> = Vec::new();
    let mut broken: Vec<RunLog> = Vec::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for e in entries {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        // Only directories hold runs (stages/ holds stages).
        if !e.file_type().is_ok_and(|t| t.is_dir())
            || crate::layout::STUDY_DIRS.contains(&name.as_ref())
        {
            continue;
        }
        match RunRecord::load_within(&path, dir) {
            Ok(Some(r)) if r.kind == UnitKind::Run => found.push((r, path)),
            Ok(Some(_)) => {}
            // A run directory whose record is gone: named, counted missing.
            Ok(None) if has_run_logs(&path) => broken.push(RunLog::unreadable(
                name,
                format!(
                    "{} holds logs but no run.json (the run's record): counted as missing, its logs unread",
                    path.display()
                ),
            )),
            Ok(None) => {}
            Err(why) => broken.push(RunLog::unreadable(name, format!("{why:#}"))),
        }
    }
    Ok((found, broken))
}

/// Leaves out runs the manifest no longer renders and counts rendered ones whose directory is
/// gone: each a problem.
fn keep_current(found: &mut Vec<Found>, rec: &StudyRecord) -> Vec<summary::Problem> {
    let mut stale = Vec::new();
    // Runs the study rendered whose directory (or record) is gone.
    let seen: std::collections::HashSet<&str> = found.iter().map(|(r, _)| r.id.as_str()).collect();
    let gone = rec
        .runs
        .iter()
        .filter(|id| !seen.contains(id.as_str()))
        .count();
    if gone > 0 {
        stale.push(summary::Problem {
            run: format!("{gone} run(s)"),
            state: "MISSING".into(),
            reason: format!(
                "{gone} of the {} runs the manifest last rendered have no directory with a run.json here: \
                 moved or removed, they are not counted",
                rec.runs.len()
            ),
        });
    }
    found.retain(|(r, _)| {
        let current = rec.runs.contains(&r.id);
        if !current {
            stale.push(summary::Problem {
                run: r.name.clone(),
                state: "STALE".into(),
                reason: format!(
                    "a run of an earlier version of {} (not among the runs it last rendered): left out; move it away or render it again",
                    rec.manifest.path
                ),
            });
        }
        current
    });
    stale
}

/// Why a failed SLURM job left no log: SLURM opens it on the node before the script runs, so
/// a node that cannot write there fails the launch silently.
fn no_log(run: &RunLog) -> Option<String> {
    let job = run.status.job_id.as_deref()?;
    let failed = matches!(run.status.state, State::Failed | State::Unknown);
    if !failed || run.log_tail.is_some() || job.starts_with("local-") || job == "none" {
        return None;
    }
    Some(format!(
        "its job {job} left no log in the run directory: SLURM could not start it there — a \
         directory the compute nodes do not see (a login node's /tmp or local disk), a full or \
         read-only file system, or a node that failed (`scontrol show job {job}`, `sacct -j {job}`)"
    ))
}

/// What a log the pattern never matched holds: its line count and its first lines.
fn unmatched(bytes: &[u8]) -> (usize, Vec<String>) {
    let mut count = 0;
    let mut first = Vec::new();
    for (_, line, _) in ingest::text_lines(bytes) {
        if line.trim().is_empty() {
            continue;
        }
        count += 1;
        if first.len() < 3 && !line.starts_with("sweep: ") {
            first.push(format!("`{}`", crate::util::text::cell(&line)));
        }
    }
    (count, first)
}

/// Whether a directory holds what a run writes: a run whose record is gone.
fn has_run_logs(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name == crate::train::run::record::METRICS_FILE
                || name == crate::layout::ENVIRONMENT_JSON
                || name.ends_with(".out")
        })
    })
}

/// Imported runs' names: their stems where distinct, else paths from the common directory.
fn import_names(paths: &[PathBuf]) -> Vec<String> {
    let stem = |p: &Path| {
        p.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let stems: Vec<String> = paths.iter().map(|p| stem(p)).collect();
    let mut distinct = stems.clone();
    distinct.sort();
    distinct.dedup();
    if distinct.len() == stems.len() {
        return stems;
    }
    // The longest directory every file is in.
    let mut common: Vec<std::path::Component> = paths[0]
        .parent()
        .map(|d| d.components().collect())
        .unwrap_or_default();
    for p in &paths[1..] {
        let dir: Vec<_> = p
            .parent()
            .map(|d| d.components().collect())
            .unwrap_or_default();
        let same = common.iter().zip(&dir).take_while(|(a, b)| a == b).count();
        common.truncate(same);
    }
    let common: PathBuf = common.iter().collect();
    paths
        .iter()
        .map(|p| {
            let relative = p.strip_prefix(&common).unwrap_or(p);
            relative.with_extension("").to_string_lossy().into_owned()
        })
        .collect()
}

/// Foreign log files, one run each; one that cannot be read is a run with its reason.
fn load_import(
    glob: &str,
    format: LogFormat,
    pattern: Option<&ingest::pattern::Pattern>,
) -> Result<(Vec<RunLog>, Vec<PathBuf>)> {
    let re = match (format, pattern) {
        (LogFormat::Pattern, Some(p)) => Some(p),
        (LogFormat::Pattern, None) => {
            bail!("--log-format pattern needs --pattern '<regex with named groups>'")
        }
        (other, Some(_)) => bail!(
            "--pattern reads lines with a regex, and --log-format {} reads its own: drop one",
            match other {
                LogFormat::Jsonl => "jsonl",
                _ => "reference",
            }
        ),
        _ => None,
    };
    let mut paths: Vec<PathBuf> = glob::glob(glob)
        .with_context(|| format!("bad glob `{glob}`"))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("listing the files of `{glob}`"))?;
    paths.sort();
    if paths.is_empty() {
        bail!("no files match `{glob}`");
    }
    let names = import_names(&paths);
    let runs = paths
        .iter()
        .zip(names)
        .map(|(p, name)| {
            // The user named these files: links may lead anywhere.
            let bytes = match ingest::read_log(p, None) {
                Ok(b) => b,
                Err(why) => return RunLog::unreadable(name, why),
            };
            let completed = Status::new(executor::State::Completed);
            match (format, &re) {
                (LogFormat::Reference, _) => ingest::reference::parse(&name, &bytes, p),
                (LogFormat::Jsonl, _) => {
                    let log = ingest::jsonl::parse(&bytes);
                    RunLog {
                        points: log.points,
                        ranks: log.ranks,
                        torn: log.torn,
                        issues: log.omitted.describe(p),
                        ..RunLog::new(name, completed)
                    }
                }
                (LogFormat::Pattern, re) => {
                    let (points, omitted) =
                        ingest::pattern::parse(re.as_ref().expect("checked above"), &bytes);
                    RunLog {
                        points,
                        issues: omitted.describe(p),
                        ..RunLog::new(name, completed)
                    }
                }
            }
        })
        .collect();
    Ok((runs, paths))
}

/// Run states from the executors; a scheduler that cannot be asked makes them unknown.
fn states_or_unknown(records: &[(&RunRecord, &Path)]) -> Vec<Status> {
    match executor::record_statuses(records) {
        Ok(s) => s,
        Err(e) => records
            .iter()
            .map(|_| {
                Status::new(executor::State::Unknown)
                    .with_reason(format!("status unavailable: {e:#}"))
            })
            .collect(),
    }
}

/// What `environment.json` tells the report: nodes, and how busy the host was without the run.
fn environment(run: &mut RunLog) {
    let Some(dir) = &run.dir else { return };
    let Ok(Some(f)) = crate::executor::fingerprint::Fingerprint::load(dir) else {
        return;
    };
    if run.block.is_some() {
        run.nodes = match f.nodes.is_empty() {
            true => vec![f.host.clone()],
            false => f.nodes.clone(),
        };
    }
    run.load = [f.load_at_start, f.load_at_end]
        .into_iter()
        .flatten()
        .collect();
    run.host = Some(f.host);
}

/// Where a run's figures are read from.
#[derive(Debug, Clone, Copy)]
enum Figures<'a> {
    /// `metrics.jsonl`: the built-in trainer's.
    Metrics,
    /// The run's logs, by a command study's line pattern.
    Pattern(&'a ingest::pattern::Pattern),
    /// A command study without a line pattern: its own `metrics.jsonl`, if any.
    Unread,
}

impl<'a> Figures<'a> {
    fn of(command: bool, pattern: &'a Option<ingest::pattern::Pattern>) -> Figures<'a> {
        match (command, pattern) {
            (_, Some(p)) => Figures::Pattern(p),
            (true, None) => Figures::Unread,
            (false, None) => Figures::Metrics,
        }
    }
}

fn read_run(name: &str, dir: &Path, study_dir: &Path, status: Status, figures: Figures) -> RunLog {
    let mut run = RunLog {
        reason: status.reason.clone(),
        dir: Some(dir.to_path_buf()),
        ..RunLog::new(name, status)
    };
    match figures {
        Figures::Pattern(re) => read_pattern_logs(&mut run, dir, study_dir, re),
        Figures::Metrics | Figures::Unread => {
            let path = dir.join(crate::train::run::record::METRICS_FILE);
            match ingest::read_log(&path, Some(study_dir)) {
                Ok(bytes) => {
                    let log = ingest::jsonl::parse(&bytes);
                    run.points = log.points;
                    run.ranks = log.ranks;
                    run.torn = log.torn;
                    run.issues.extend(log.omitted.describe(&path));
                    run.issues.extend(log.notes);
                }
                Err(_) if !path.exists() && path.symlink_metadata().is_err() => {
                    if run.reason.is_none() {
                        run.reason = Some(match (figures, run.status.state.is_active()) {
                            (Figures::Unread, _) => "no metrics.jsonl, and no `[report] line_pattern` to read the command's log by (docs/report.md)".into(),
                            (_, true) => "no metrics.jsonl yet".into(),
                            (_, false) => {
                                "no metrics.jsonl: the run wrote none (its log says why)".into()
                            }
                        });
                    }
                }
                Err(why) => run.issues.push(why),
            }
        }
    }
    let stopped = !matches!(
        run.status.state,
        State::Completed | State::Running | State::Pending
    );
    if stopped {
        run.log_tail = ingest::LogTail::read(dir, run.status.job_id.as_deref());
        if let Some(why) = no_log(&run) {
            run.issues.push(why);
        }
    }
    if run.points.is_empty() && run.reason.is_none() && run.issues.is_empty() {
        run.reason = Some(match run.status.state.is_active() {
            true => "no metrics yet".into(),
            false => "no metrics".into(),
        });
    }
    run
}

/// A command run's points from its `*.out` logs; a completed run's log that never matched says so.
fn read_pattern_logs(
    run: &mut RunLog,
    dir: &Path,
    study_dir: &Path,
    re: &ingest::pattern::Pattern,
) {
    let (logs, faults) = ingest::list_job_logs(dir);
    run.issues.extend(faults);
    // The current attempt's figures alone: its job's log from its last start.
    let mut missed = None;
    let log = ingest::attempt_log(&logs, run.status.job_id.as_deref());
    if let Some(l) = &log {
        match ingest::read_log(l, Some(study_dir)) {
            Ok(bytes) => {
                let (attempt, earlier) = ingest::this_attempt(&bytes);
                let (points, omitted) = ingest::pattern::parse(re, attempt);
                if points.is_empty() {
                    missed = Some((l, unmatched(attempt)));
                }
                run.points.extend(points);
                run.issues.extend(omitted.describe(l));
                let others = logs.len() - 1 + earlier;
                if others > 0 && !run.points.is_empty() {
                    run.issues.push(format!(
                        "figures from its last attempt only: {others} earlier attempt(s) kept in its log(s), not read"
                    ));
                }
            }
            Err(why) => run.issues.push(why),
        }
    }
    // A log the pattern never matched: quote what it says instead.
    let completed = run.status.state == crate::executor::State::Completed;
    let none = run.points.is_empty() && completed && run.issues.is_empty();
    if let Some((log, (count, first))) = missed.filter(|_| none) {
        let shown = match first.is_empty() {
            true => "none of them the program's".to_string(),
            false => format!("the program's first: {}", first.join(" · ")),
        };
        run.reason = Some(format!(
            "no line of {} matches [report] line_pattern `{}`: it has {count} lines, {shown}",
            log.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            crate::util::text::cell(re.as_str())
        ));
    }
}
