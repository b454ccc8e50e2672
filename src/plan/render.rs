//! Plan -> run directories: rendered in memory first (a template error writes nothing), then
//! written only where content changed (re-rendering is idempotent).

use super::record::{ManifestRef, RunRecord, StudyRecord, UnitKind};
use super::templates::Templates;
use super::{Job, Plan};
use crate::layout::{CHECKPOINTS_DIR, CONFIG_TOML, JOB_SBATCH, METRICS_JSONL, STUDY_JSON};
use crate::manifest::{Diagnostic, Diagnostics};
use crate::util::fs::{read_regular, write_atomic, write_if_changed};
use anyhow::{Context, Result};
use rayon::prelude::*;
use serde_json::json;
use std::path::{Path, PathBuf};

/// One directory's files, ready to write.
#[derive(Debug, Clone)]
pub struct RenderedDir {
    pub dir: PathBuf,
    /// `config.toml` (runs only).
    pub config: Option<String>,
    pub script: String,
    pub record: RunRecord,
    /// `record` as written (`run.json`/`stage.json`).
    pub record_bytes: Vec<u8>,
    pub record_file: &'static str,
}

#[derive(Debug, Clone)]
pub struct Rendered {
    pub runs: Vec<RenderedDir>,
    pub stages: Vec<RenderedDir>,
    /// What `results/<study>` records of the manifest (`study.json`).
    pub study: StudyRecord,
    /// Runs whose directories hold another run that failed before its first metric: rendered
    /// afresh, their directories moved aside first ([`move_failed_empty_aside`]).
    pub failed_empty: Vec<String>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteSummary {
    pub files_written: usize,
    pub files_unchanged: usize,
}

/// What rendering does with a run whose directory holds another run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnChanged {
    /// An error that lists every such run and what changed in it.
    Refuse,
    /// Render it afresh: the caller moves the old directory aside first ([`move_changed_aside`]).
    Replace,
}

/// Renders every run and stage of the plan in memory.
pub fn render(plan: &Plan) -> Result<Rendered, Diagnostics> {
    render_with(plan, OnChanged::Refuse)
}

/// [`render`], with a choice for the runs whose directories hold another run.
pub fn render_with(plan: &Plan, on_changed: OnChanged) -> Result<Rendered, Diagnostics> {
    let templates = Templates::load(plan)?;
    let (attempt, study_attempt_id) = current_attempt(plan)?;
    let fresh = Fresh::new(plan, attempt);
    let changed = std::sync::Mutex::new(Vec::new());
    let empty = std::sync::Mutex::new(Vec::new());
    let pattern = log_pattern(plan);
    let runs: Vec<Result<RenderedDir, Diagnostics>> = plan
        .runs
        .par_iter()
        .map(|run| {
            let (dir, was) = render_run(plan, run, &templates, &fresh, &study_attempt_id)?;
            match (was, on_changed) {
                (Some(old), _) if failed_empty(&run.dir, &old, pattern.as_ref()) => {
                    empty
                        .lock()
                        .expect("no panic holding it")
                        .push(run.name.clone());
                }
                (Some(old), OnChanged::Refuse) => {
                    let what = Changed::of(run, &old);
                    changed.lock().expect("no panic holding it").push(what);
                }
                _ => {}
            }
            Ok(dir)
        })
        .collect();
    let stages: Vec<Result<RenderedDir, Diagnostics>> = plan
        .stages
        .iter()
        .map(|s| render_stage(plan, s, &templates, &fresh))
        .collect();

    let mut errors = Vec::new();
    let mut ok = |v: Vec<Result<RenderedDir, Diagnostics>>| -> Vec<RenderedDir> {
        v.into_iter()
            .filter_map(|r| r.map_err(|e| errors.extend(e.0)).ok())
            .collect()
    };
    let runs = ok(runs);
    let stages = ok(stages);
    let changed = changed.into_inner().expect("no panic holding it");
    if !changed.is_empty() {
        errors.push(Changed::diagnostic(plan, changed));
    }
    if !errors.is_empty() {
        errors.dedup();
        return Err(Diagnostics(errors));
    }
    let mut failed_empty = empty.into_inner().expect("no panic holding it");
    failed_empty.sort();
    Ok(Rendered {
        runs,
        stages,
        study: StudyRecord::of(plan, attempt, study_attempt_id),
        failed_empty,
    })
}

/// A command study's line pattern, which says whether a log holds a metric.
fn log_pattern(plan: &Plan) -> Option<regex::Regex> {
    let m = &plan.manifest;
    match m.mode {
        crate::manifest::Mode::Command(_) => {
            crate::util::text::regex(m.report.line_pattern.as_deref()?).ok()
        }
        crate::manifest::Mode::Train(_) => None,
    }
}

/// Whether the run a directory holds failed before its first metric (an error exit, no metrics,
/// checkpoint or matched line): not a measurement, so a changed run replaces it.
fn failed_empty(dir: &Path, old: &RunRecord, pattern: Option<&regex::Regex>) -> bool {
    let Some(job) = old.jobs.last() else {
        return false;
    };
    let failed = super::record::exit_status(dir, &job.job_id)
        .is_some_and(|rc| rc != 0 && rc != crate::config::REQUEUE_EXIT);
    if !failed || dir.join(METRICS_JSONL).exists() || dir.join(CHECKPOINTS_DIR).exists() {
        return false;
    }
    let Some(re) = pattern else {
        return true;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    // A log too large to read whole is kept where it is.
    const MAX_LOG: u64 = 64 << 20;
    entries.flatten().all(|e| {
        let path = e.path();
        if !crate::layout::is_job_log(&path) {
            return true;
        }
        read_regular(&path, MAX_LOG, None)
            .is_ok_and(|b| !String::from_utf8_lossy(&b).lines().any(|l| re.is_match(l)))
    })
}

/// What every record rendered now starts from: manifest, commit, time and attempt.
struct Fresh {
    study: String,
    manifest: ManifestRef,
    git_commit: Option<String>,
    now: String,
    attempt: u32,
}

impl Fresh {
    fn new(plan: &Plan, attempt: u32) -> Fresh {
        let m = &plan.manifest;
        Fresh {
            study: m.name.clone(),
            manifest: ManifestRef {
                path: m.path.display().to_string(),
                sha256: m.sha256.clone(),
            },
            git_commit: crate::util::process::git_commit(&m.root),
            now: crate::util::now_rfc3339(),
            attempt,
        }
    }

    fn record(
        &self,
        id: &str,
        name: &str,
        kind: UnitKind,
        params: indexmap::IndexMap<String, serde_json::Value>,
        depends_on: Option<String>,
    ) -> RunRecord {
        RunRecord {
            id: id.to_string(),
            name: name.to_string(),
            study: self.study.clone(),
            kind,
            manifest: self.manifest.clone(),
            git_commit: self.git_commit.clone(),
            sweep_version: env!("CARGO_PKG_VERSION").to_string(),
            created_at: self.now.clone(),
            params,
            configuration: None,
            depends_on,
            identity: None,
            jobs: Vec::new(),
            attempt: self.attempt,
            environment: None,
            block: None,
            attempt_id: None,
            study_attempt_id: None,
        }
    }
}

/// A run's directory as rendering leaves it (configuration, job script, record), and the record
/// on disk where the directory holds another run.
fn render_run(
    plan: &Plan,
    run: &super::Run,
    templates: &Templates,
    fresh: &Fresh,
    study_attempt_id: &str,
) -> Result<(RenderedDir, Option<RunRecord>), Diagnostics> {
    let m = &plan.manifest;
    let config = config_toml(plan, run)?;
    let script = templates.run_script(plan, run, &plan.sweep_bin)?;
    let depends_on = run.stage.map(|s| plan.stages[s].name.clone());
    let new = RunRecord {
        configuration: Some(run.configuration.clone()),
        identity: Some(run.identity.clone()),
        environment: (m.environment != Default::default()).then(|| m.environment.clone()),
        block: run.block,
        attempt_id: Some(super::record::new_attempt_id()),
        study_attempt_id: Some(study_attempt_id.to_string()),
        ..fresh.record(
            &run.id,
            &run.name,
            UnitKind::Run,
            run.params.clone(),
            depends_on,
        )
    };
    let (record, was) = match merge(&run.dir, new.clone())? {
        Merged::Record(r) => (*r, None),
        Merged::Changed(old) => (new, Some(*old)),
    };
    let dir = RenderedDir {
        dir: run.dir.clone(),
        config: Some(config),
        script,
        record_bytes: record.to_bytes(),
        record,
        record_file: UnitKind::Run.record_file(),
    };
    Ok((dir, was))
}

/// A stage's directory as rendering leaves it: its job script and record.
fn render_stage(
    plan: &Plan,
    s: &super::Stage,
    templates: &Templates,
    fresh: &Fresh,
) -> Result<RenderedDir, Diagnostics> {
    let params = [
        ("dataset", json!(s.dataset)),
        ("tokenizer", json!(s.tokenizer)),
        ("sequence_length", json!(s.sequence_length)),
        ("format", json!(s.format.as_str())),
        ("output", json!(s.output)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let script = templates.stage_script(plan, s, &plan.sweep_bin)?;
    // A stage's id names its directory: another id is another directory.
    let record = match merge(
        &s.dir,
        fresh.record(&s.id, &s.name, UnitKind::Stage, params, None),
    )? {
        Merged::Record(r) => *r,
        // A stage's directory, named by its id, holds another stage only when its record was edited.
        Merged::Changed(_) => {
            let d = Diagnostic::new(
                s.dir.join(UnitKind::Stage.record_file()),
                format!(
                    "this directory is stage {}'s, and its record names another stage",
                    s.id
                ),
            )
            .with_help(
                "repair the record, or move the stage's directory away to run the stage afresh",
            );
            return Err(d.into());
        }
    };
    Ok(RenderedDir {
        dir: s.dir.clone(),
        config: None,
        script,
        record_bytes: record.to_bytes(),
        record,
        record_file: UnitKind::Stage.record_file(),
    })
}

/// The study's current attempt and id from `study.json` (1 and a new id before the first render).
fn current_attempt(plan: &Plan) -> Result<(u32, String), Diagnostics> {
    match StudyRecord::load(&plan.study_dir) {
        Ok(rec) => Ok(match rec {
            Some(r) => (
                r.attempt,
                r.attempt_id
                    .unwrap_or_else(super::record::new_attempt_id),
            ),
            None => (1, super::record::new_attempt_id()),
        }),
        Err(e) => Err(Diagnostic::new(plan.study_dir.join(STUDY_JSON), format!("{e:#}"))
            .with_help("it counts the study's attempts (`sweep run --again`): repair it, or move it away to count from 1")
            .into()),
    }
}

/// A run's `config.toml`: the trainer's configuration, or a command run's command and
/// parameters; a value TOML cannot hold is an error, never an empty file.
fn config_toml(plan: &Plan, run: &super::Run) -> Result<String, Diagnostics> {
    let m = &plan.manifest;
    let body = match &run.job {
        Job::Train(cfg) => toml::to_string(cfg.as_ref()),
        Job::Command(cmd) => {
            let mut table = toml::Table::new();
            table.insert("command".into(), toml::Value::String(cmd.clone()));
            let params = serde_json::from_value::<toml::Value>(json!(run.params));
            match params {
                Ok(p) => {
                    table.insert("params".into(), p);
                    toml::to_string(&table)
                }
                Err(e) => {
                    let d = m.source.at_key(
                        "sweep",
                        format!("run `{}`: its parameters have no TOML form: {e}", run.name),
                    );
                    return Err(d.into());
                }
            }
        }
    }
    .map_err(|e| {
        Diagnostic::new(
            run.dir.join(CONFIG_TOML),
            format!(
                "cannot write run `{}`'s configuration as TOML: {e}",
                run.name
            ),
        )
    })?;
    let what = match &run.job {
        Job::Train(_) => format!(": what `sweep train` executes.\n# Written by sweep from {}; edit the manifest, not this file", m.path.display()),
        Job::Command(_) => String::new(),
    };
    Ok(format!(
        "# Run `{}` ({}) of study `{}`{what}.\n\n{body}",
        run.name, run.id, m.name
    ))
}

/// What an existing directory makes of a freshly rendered record.
enum Merged {
    /// The record to write: the fresh one, or the same run's (creation, commit and jobs kept).
    Record(Box<RunRecord>),
    /// The directory holds the jobs or outputs of another run (this record).
    Changed(Box<RunRecord>),
}

/// Keeps what an existing record of the same run knows; says when it is a different run.
fn merge(dir: &Path, fresh: RunRecord) -> Result<Merged, Diagnostics> {
    let file = fresh.kind.record_file();
    // One failed open per new run is cheaper than a stat first.
    let old = match RunRecord::read(&dir.join(file), None) {
        Ok(old) => old,
        // A record that cannot be read may hold the run's job ids: replacing it would lose its state.
        Err(e) => {
            let d = Diagnostic::new(dir.join(file), format!("{e:#}")).with_help(
                "it records the run's jobs: repair it, or move the run directory away to start the run afresh",
            );
            return Err(d.into());
        }
    };
    let Some(old) = old else {
        return Ok(Merged::Record(Box::new(fresh)));
    };
    let same = old.id == fresh.id;
    if !same && (!old.jobs.is_empty() || has_outputs(dir)) {
        return Ok(Merged::Changed(Box::new(old)));
    }
    if !same {
        return Ok(Merged::Record(Box::new(fresh)));
    }
    Ok(Merged::Record(Box::new(RunRecord {
        created_at: old.created_at,
        git_commit: old.git_commit,
        sweep_version: old.sweep_version,
        jobs: old.jobs,
        attempt: old.attempt,
        // The directory's measurement goes on.
        attempt_id: old.attempt_id.or(fresh.attempt_id),
        study_attempt_id: old.study_attempt_id.or(fresh.study_attempt_id),
        ..fresh
    })))
}

/// A run whose directory holds another run's jobs or outputs, and its identity's changes.
struct Changed {
    name: String,
    /// (dotted key, as it was, as it is now).
    fields: Vec<(String, String, String)>,
    /// Its record is an earlier build's, without an identity: it cannot be told apart.
    earlier: bool,
}

impl Changed {
    fn of(run: &super::Run, old: &RunRecord) -> Changed {
        Changed {
            name: run.name.clone(),
            fields: old
                .identity
                .as_ref()
                .map(|identity| super::identity::differences(identity, &run.identity))
                .unwrap_or_default(),
            earlier: old.identity.is_none(),
        }
    }

    /// One error for all of them: which fields changed in how many runs, and the ways forward.
    fn diagnostic(plan: &Plan, mut changed: Vec<Changed>) -> Diagnostic {
        changed.sort_by(|a, b| a.name.cmp(&b.name));
        let mut by_field: indexmap::IndexMap<&str, (usize, &str, &str)> = indexmap::IndexMap::new();
        let (mut unexplained, mut earlier) = (0, 0);
        for c in &changed {
            match (c.earlier, c.fields.is_empty()) {
                (true, _) => earlier += 1,
                (false, true) => unexplained += 1,
                (false, false) => {}
            }
            for (k, old, new) in &c.fields {
                by_field.entry(k.as_str()).or_insert((0, old, new)).0 += 1;
            }
        }
        let mut what: Vec<String> = by_field
            .iter()
            .map(|(k, (n, old, new))| format!("`{k}` {old} → {new} ({n} run(s))"))
            .collect();
        if unexplained > 0 {
            what.push(format!(
                "the job's shape, a swept [slurm] key or the [local] settings ({unexplained} run(s))"
            ));
        }
        if earlier > 0 {
            what.push(format!(
                "written by an earlier build of sweep, whose records hold no run identity: whether they are these runs cannot be told ({earlier} run(s))"
            ));
        }
        let names: Vec<&str> = changed.iter().take(5).map(|c| c.name.as_str()).collect();
        let more = match changed.len() {
            n if n > 5 => format!(" and {} more", n - 5),
            _ => String::new(),
        };
        let m = &plan.manifest;
        // At the first changed key where the manifest writes it (a command's is `params.<key>`).
        let mut d = match by_field.keys().next() {
            Some(k) => m.locate(k.strip_prefix("params.").unwrap_or(k)),
            None => m.source.at_key("sweep", ""),
        };
        d.message = format!(
            "{} run(s) whose directories hold their jobs and outputs would now run something else ({}{more}): {}",
            changed.len(),
            names.join(", "),
            what.join("; ")
        );
        d.help = Some(format!(
            "`--replace-changed` (sweep submit, run or render) moves their directories to {}/ and runs them anew; \
             or keep them and give the new runs other names ([sweep] name)",
            plan.study_dir.join(crate::layout::REPLACED_DIR).display()
        ));
        d
    }
}

/// Moves aside, whole, each directory holding another run's jobs or outputs (to
/// `results/<study>/replaced/<time>/<run>`), so the run starts afresh; where each went.
pub fn move_changed_aside(plan: &Plan) -> Result<Vec<(String, PathBuf)>> {
    move_aside(plan, |_, _| true)
}

/// [`move_changed_aside`] for directories holding a run that failed before its first metric
/// (judged again here, under the study's lock).
pub fn move_failed_empty_aside(plan: &Plan) -> Result<Vec<(String, PathBuf)>> {
    let pattern = log_pattern(plan);
    move_aside(plan, |dir, old| failed_empty(dir, old, pattern.as_ref()))
}

fn move_aside(
    plan: &Plan,
    chosen: impl Fn(&Path, &RunRecord) -> bool,
) -> Result<Vec<(String, PathBuf)>> {
    let mut into: Option<PathBuf> = None;
    let mut moved = Vec::new();
    for run in &plan.runs {
        let Some(old) = RunRecord::read(&run.dir.join(UnitKind::Run.record_file()), None)? else {
            continue;
        };
        let same = old.id == run.id;
        if same || (old.jobs.is_empty() && !has_outputs(&run.dir)) || !chosen(&run.dir, &old) {
            continue;
        }
        let into = match &into {
            Some(d) => d,
            None => into.insert(fresh_dir(
                &plan.study_dir.join(crate::layout::REPLACED_DIR),
            )?),
        };
        let to = into.join(&run.name);
        std::fs::rename(&run.dir, &to)
            .with_context(|| format!("moving {} to {}", run.dir.display(), to.display()))?;
        moved.push((run.name.clone(), to));
    }
    Ok(moved)
}

/// A new directory in `parent` named by the time (`20261125T101500Z`, then `…Z-2`), made here.
fn fresh_dir(parent: &Path) -> Result<PathBuf> {
    crate::util::fs::make_dir(parent)?;
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
    for n in 1..10_000 {
        let dir = match n {
            1 => parent.join(&stamp),
            n => parent.join(format!("{stamp}-{n}")),
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    anyhow::bail!(
        "{} holds 10,000 directories of this second: move some away",
        parent.display()
    )
}

/// Starts the study's next attempt (`sweep run --again`): every run directory moves to
/// `attempts/<attempt>/<run>`; returns the attempt and where it went. Safe to run again.
pub fn start_next_attempt(plan: &Plan) -> Result<(u32, PathBuf)> {
    let (attempt, _) = current_attempt(plan).map_err(anyhow::Error::new)?;
    // A count read from a file: its next one may not exist.
    let next = attempt.checked_add(1).ok_or_else(|| {
        anyhow::anyhow!(
            "{} counts {attempt} attempts, the most there can be",
            plan.study_dir.join(STUDY_JSON).display()
        )
    })?;
    let into = plan
        .study_dir
        .join(crate::layout::ATTEMPTS_DIR)
        .join(attempt.to_string());
    for run in &plan.runs {
        if run.dir.symlink_metadata().is_err() {
            continue;
        }
        crate::util::fs::make_dir(&into)?;
        let to = into.join(&run.name);
        if to.symlink_metadata().is_ok() {
            anyhow::bail!(
                "{} already holds run {} of attempt {attempt}: move one of the two away",
                to.display(),
                run.name
            );
        }
        std::fs::rename(&run.dir, &to)
            .with_context(|| format!("moving {} to {}", run.dir.display(), to.display()))?;
    }
    crate::util::fs::make_dir(&plan.study_dir)?;
    let study = StudyRecord::of(plan, next, super::record::new_attempt_id());
    let bytes = serde_json::to_vec_pretty(&study).expect("a study record serialises");
    write_atomic(&plan.study_dir.join(STUDY_JSON), &bytes)?;
    Ok((attempt, into))
}

/// Anything in the directory besides what rendering writes.
fn has_outputs(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            !crate::layout::RENDERED.contains(&n.as_ref())
        })
    })
}

/// Writes the rendered directories in parallel, touching only changed files (new directories
/// without reading first: on a slow file system every lookup counts).
pub fn write(rendered: &Rendered) -> Result<WriteSummary> {
    let dir = &rendered.study.dir;
    crate::util::fs::make_dir(dir)?;
    let study = serde_json::to_vec_pretty(&rendered.study).expect("a study record serialises");
    write_if_changed(&dir.join(STUDY_JSON), &study)?;
    let all: Vec<&RenderedDir> = rendered.stages.iter().chain(&rendered.runs).collect();
    let mut parents: Vec<&Path> = all.iter().filter_map(|r| r.dir.parent()).collect();
    parents.sort_unstable();
    parents.dedup();
    for p in parents {
        crate::util::fs::make_dir(p)?;
    }
    let counts: Vec<Result<(usize, usize)>> = all
        .par_iter()
        .map(|r| {
            let fresh = match std::fs::create_dir(&r.dir) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
                Err(e) => return Err(e).with_context(|| format!("creating {}", r.dir.display())),
            };
            let mut files: Vec<(PathBuf, &[u8])> = vec![
                (r.dir.join(JOB_SBATCH), r.script.as_bytes()),
                (r.dir.join(r.record_file), &r.record_bytes),
            ];
            if let Some(c) = &r.config {
                files.push((r.dir.join(CONFIG_TOML), c.as_bytes()));
            }
            let mut written = 0;
            for (path, bytes) in &files {
                if fresh {
                    write_atomic(path, bytes)?;
                    written += 1;
                } else if write_if_changed(path, bytes)? {
                    written += 1;
                }
            }
            Ok((written, files.len() - written))
        })
        .collect();
    let mut s = WriteSummary::default();
    for c in counts {
        let (w, u) = c?;
        s.files_written += w;
        s.files_unchanged += u;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two moves aside in one second (two `--replace-changed`) each get a
    /// directory of their own.
    #[test]
    fn each_move_aside_gets_a_directory_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let made: Vec<PathBuf> = (0..3).map(|_| fresh_dir(dir.path()).unwrap()).collect();
        assert!(made.iter().all(|d| d.is_dir()));
        assert!(made[0] != made[1] && made[1] != made[2] && made[0] != made[2]);
    }
}
