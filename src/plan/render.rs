//! Plan -> run directories. Everything is rendered in memory first (so a
//! template error writes nothing), then written file by file, only where the
//! content changed: re-rendering is idempotent and never touches outputs.

use super::files::{CONFIG_TOML, JOB_SBATCH};
use super::record::{ManifestRef, RunRecord, UnitKind};
use super::templates::Templates;
use super::{Job, Plan};
use crate::manifest::{Diagnostic, Diagnostics};
use crate::util::fs::{write_atomic, write_if_changed};
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
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteSummary {
    pub files_written: usize,
    pub files_unchanged: usize,
}

/// Renders every run and stage of the plan in memory.
pub fn render(plan: &Plan) -> Result<Rendered, Diagnostics> {
    let templates = Templates::load(plan)?;
    let sweep_bin = &plan.sweep_bin;
    let m = &plan.manifest;
    let manifest = ManifestRef {
        path: m.path.display().to_string(),
        sha256: m.sha256.clone(),
    };
    let git_commit = crate::util::process::git_commit(&m.root);
    let now = crate::util::now_rfc3339();
    let fresh = |id: &str, name: &str, kind: UnitKind, params, depends_on| RunRecord {
        id: id.to_string(),
        name: name.to_string(),
        study: m.name.clone(),
        kind,
        manifest: manifest.clone(),
        git_commit: git_commit.clone(),
        sweep_version: env!("CARGO_PKG_VERSION").to_string(),
        created_at: now.clone(),
        params,
        configuration: None,
        depends_on,
        jobs: Vec::new(),
    };

    let runs: Vec<Result<RenderedDir, Diagnostics>> = plan
        .runs
        .par_iter()
        .map(|run| {
            let config = config_toml(plan, run)?;
            let script = templates.run_script(plan, run, sweep_bin)?;
            let depends_on = run.stage.map(|s| plan.stages[s].name.clone());
            let record = merge(
                &run.dir,
                RunRecord {
                    configuration: Some(run.configuration.clone()),
                    ..fresh(
                        &run.id,
                        &run.name,
                        UnitKind::Run,
                        run.params.clone(),
                        depends_on,
                    )
                },
            )?;
            Ok(RenderedDir {
                dir: run.dir.clone(),
                config: Some(config),
                script,
                record_bytes: record.to_bytes(),
                record,
                record_file: UnitKind::Run.record_file(),
            })
        })
        .collect();
    let stages: Vec<Result<RenderedDir, Diagnostics>> = plan
        .stages
        .iter()
        .map(|s| {
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
            let script = templates.stage_script(plan, s, sweep_bin)?;
            let record = merge(&s.dir, fresh(&s.id, &s.name, UnitKind::Stage, params, None))?;
            Ok(RenderedDir {
                dir: s.dir.clone(),
                config: None,
                script,
                record_bytes: record.to_bytes(),
                record,
                record_file: UnitKind::Stage.record_file(),
            })
        })
        .collect();

    let mut errors = Vec::new();
    let mut ok = |v: Vec<Result<RenderedDir, Diagnostics>>| -> Vec<RenderedDir> {
        v.into_iter()
            .filter_map(|r| r.map_err(|e| errors.extend(e.0)).ok())
            .collect()
    };
    let runs = ok(runs);
    let stages = ok(stages);
    if !errors.is_empty() {
        errors.dedup();
        return Err(Diagnostics(errors));
    }
    Ok(Rendered { runs, stages })
}

/// A run's `config.toml`: the trainer's configuration, or an any-command
/// run's command and parameters. A value that TOML cannot hold is an error
/// here, never an empty file.
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

/// Keeps what an existing record knows (creation time, commit, jobs) when the
/// run is the same; refuses to reuse a directory for a different run.
fn merge(dir: &Path, fresh: RunRecord) -> Result<RunRecord, Diagnostics> {
    let file = fresh.kind.record_file();
    // One failed open per new run is cheaper than a stat first.
    let old = match RunRecord::read(&dir.join(file), None) {
        Ok(old) => old,
        // A record that cannot be read may hold the run's job ids:
        // replacing it would lose them, and with them the run's state.
        Err(e) => {
            let d = Diagnostic::new(dir.join(file), format!("{e:#}")).with_help(
                "it records the run's jobs: repair it, or move the run directory away to start the run afresh",
            );
            return Err(d.into());
        }
    };
    let Some(old) = old else { return Ok(fresh) };
    if old.id != fresh.id && (!old.jobs.is_empty() || has_outputs(dir)) {
        let d = Diagnostic::new(
            dir.join(file),
            format!(
                "run directory `{}` holds run {} but the manifest now gives it configuration {}",
                fresh.name, old.id, fresh.id
            ),
        )
        .with_help("its outputs would be mixed up: rename the run (sweep.name) or move the old directory away");
        return Err(d.into());
    }
    if old.id != fresh.id {
        return Ok(fresh);
    }
    Ok(RunRecord {
        created_at: old.created_at,
        git_commit: old.git_commit,
        sweep_version: old.sweep_version,
        jobs: old.jobs,
        ..fresh
    })
}

/// Anything in the directory besides what rendering writes.
fn has_outputs(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            !super::files::RENDERED.contains(&n.as_ref())
        })
    })
}

/// Writes the rendered directories (in parallel), touching only changed files.
/// A directory that did not exist yet gets its files without reading first:
/// on a slow file system every avoidable lookup counts.
pub fn write(rendered: &Rendered) -> Result<WriteSummary> {
    let all: Vec<&RenderedDir> = rendered.stages.iter().chain(&rendered.runs).collect();
    let mut parents: Vec<&Path> = all.iter().filter_map(|r| r.dir.parent()).collect();
    parents.sort_unstable();
    parents.dedup();
    for p in parents {
        std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
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
