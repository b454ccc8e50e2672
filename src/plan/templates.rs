//! Job-script templates: the project's `templates/` folder when it has one,
//! else the copies built into the binary; a manifest may name its own file.

use super::record::UnitKind;
use super::{Plan, Run, Stage};
use crate::manifest::{did_you_mean, Diagnostic, Diagnostics, SlurmSpec};
use crate::template::{describe, Engine};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// (name in manifests, file name, built-in text)
const BUILTIN: &[(&str, &str, &str)] = &[
    (
        "single-node",
        "train-single-node.sbatch.j2",
        include_str!("../../templates/train-single-node.sbatch.j2"),
    ),
    (
        "multi-node",
        "train-multi-node.sbatch.j2",
        include_str!("../../templates/train-multi-node.sbatch.j2"),
    ),
    (
        "pretokenize",
        "pretokenize.sbatch.j2",
        include_str!("../../templates/pretokenize.sbatch.j2"),
    ),
    (
        "",
        "_header.sbatch.j2",
        include_str!("../../templates/_header.sbatch.j2"),
    ),
    (
        "",
        "_prologue.sh.j2",
        include_str!("../../templates/_prologue.sh.j2"),
    ),
    (
        "",
        "_launch.sh.j2",
        include_str!("../../templates/_launch.sh.j2"),
    ),
];

pub const TEMPLATE_NAMES: &[&str] = &["auto", "single-node", "multi-node", "pretokenize"];

/// The loaded templates of one plan.
pub struct Templates {
    engine: Engine,
    /// template name -> file shown in errors and in the script header
    files: Vec<(String, PathBuf)>,
}

#[derive(Serialize)]
struct ScriptContext<'a> {
    sweep_version: &'a str,
    study: &'a str,
    template: String,
    kind: UnitKind,
    run: RunInfo<'a>,
    job_name: String,
    slurm: &'a SlurmSpec,
    command: minijinja::Value,
}

#[derive(Serialize)]
struct RunInfo<'a> {
    id: &'a str,
    name: &'a str,
    dir: &'a Path,
}

impl Templates {
    /// Loads every template the plan's runs and stages use.
    pub fn load(plan: &Plan) -> Result<Templates, Diagnostics> {
        let m = &plan.manifest;
        let dir = m.root.join("templates");
        let mut t = Templates {
            engine: Engine::new(),
            files: Vec::new(),
        };
        for (_, file, text) in BUILTIN {
            let path = dir.join(file);
            let source = std::fs::read_to_string(&path).unwrap_or_else(|_| text.to_string());
            t.add(file, &path, &source)?;
        }
        let mut chosen: Vec<&str> = plan
            .runs
            .iter()
            .map(|r| r.slurm.template.as_str())
            .collect();
        chosen.extend(plan.stages.iter().map(|s| s.slurm.template.as_str()));
        chosen.sort_unstable();
        chosen.dedup();
        for name in chosen {
            if TEMPLATE_NAMES.contains(&name) {
                continue;
            }
            let key = if plan.stages.iter().any(|s| s.slurm.template == name) {
                "stages.pretokenize.template"
            } else {
                "slurm.template"
            };
            if !looks_like_path(name) {
                let help = match did_you_mean(name, TEMPLATE_NAMES.iter().copied()) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => format!(
                        "use one of {} or the path of a template file",
                        TEMPLATE_NAMES.join(", ")
                    ),
                };
                return Err(m
                    .locate(key)
                    .with_help(help)
                    .with_message(format!("unknown template `{name}`"))
                    .into());
            }
            let path = crate::util::fs::absolute(&m.root, Path::new(name));
            let source = std::fs::read_to_string(&path).map_err(|e| {
                m.locate(key)
                    .with_message(format!("cannot read template {}: {e}", path.display()))
            })?;
            t.add(name, &path, &source)?;
        }
        Ok(t)
    }

    fn add(&mut self, name: &str, path: &Path, source: &str) -> Result<(), Diagnostics> {
        self.engine
            .add(name, source)
            .map_err(|e| template_error(path, &e))?;
        self.files.push((name.to_string(), path.to_path_buf()));
        Ok(())
    }

    fn file_of(&self, name: &str) -> PathBuf {
        self.files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| PathBuf::from(name))
    }

    /// The template file a run uses.
    fn resolve(name: &str, slurm: &SlurmSpec) -> String {
        let name = match name {
            "auto" if slurm.nodes > 1 => "multi-node",
            "auto" => "single-node",
            other => other,
        };
        BUILTIN
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, f, _)| f.to_string())
            .unwrap_or_else(|| name.to_string())
    }

    pub fn run_script(
        &self,
        plan: &Plan,
        run: &Run,
        sweep_bin: &str,
    ) -> Result<String, Diagnostics> {
        let info = RunInfo {
            id: &run.id,
            name: &run.name,
            dir: &run.dir,
        };
        self.render(
            plan,
            &run.slurm,
            UnitKind::Run,
            info,
            run.command(sweep_bin),
        )
    }

    pub fn stage_script(
        &self,
        plan: &Plan,
        stage: &Stage,
        sweep_bin: &str,
    ) -> Result<String, Diagnostics> {
        let info = RunInfo {
            id: &stage.id,
            name: &stage.name,
            dir: &stage.dir,
        };
        self.render(
            plan,
            &stage.slurm,
            UnitKind::Stage,
            info,
            stage.command(sweep_bin),
        )
    }

    fn render(
        &self,
        plan: &Plan,
        slurm: &SlurmSpec,
        kind: UnitKind,
        run: RunInfo<'_>,
        command: String,
    ) -> Result<String, Diagnostics> {
        let name = Self::resolve(&slurm.template, slurm);
        let file = self.file_of(&name);
        let ctx = ScriptContext {
            sweep_version: env!("CARGO_PKG_VERSION"),
            study: &plan.manifest.name,
            template: file
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            kind,
            run,
            job_name: slurm
                .job_name
                .clone()
                .unwrap_or_else(|| plan.manifest.name.clone()),
            slurm,
            command: minijinja::Value::from_safe_string(crate::template::launch_line(&command)),
        };
        self.engine
            .render(&name, &crate::template::context(&ctx))
            .map_err(|e| {
                let path = e.name().map(|n| self.file_of(n)).unwrap_or(file);
                template_error(&path, &e)
            })
    }
}

fn looks_like_path(name: &str) -> bool {
    name.contains('/') || name.ends_with(".j2")
}

/// A template error as a diagnostic at the template's file and line.
fn template_error(path: &Path, e: &minijinja::Error) -> Diagnostics {
    let mut d = Diagnostic::new(path, format!("template error: {}", describe(e)));
    if let Some(line) = e.line() {
        d.line = line;
        d.column = 1;
        d.excerpt = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.lines().nth(line - 1).map(str::to_string));
    }
    d.into()
}
