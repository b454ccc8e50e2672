//! Job-script templates: the project's `templates/` folder when it has one,
//! else the copies built into the binary; a manifest may name its own file.

use super::launch::Launch;
use super::record::UnitKind;
use super::{Plan, Run, Stage};
use crate::manifest::{Diagnostic, Diagnostics, ExecutorKind, Launcher, SlurmSpec, TemplateChoice};
use crate::template::{describe, Engine};
use crate::util::fs::{read_regular, ReadError};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// (the built-in template, file name, built-in text); partials have none.
const BUILTIN: &[(Option<TemplateChoice>, &str, &str)] = &[
    (
        Some(TemplateChoice::SingleNode),
        "train-single-node.sbatch.j2",
        include_str!("../../templates/train-single-node.sbatch.j2"),
    ),
    (
        Some(TemplateChoice::MultiNode),
        "train-multi-node.sbatch.j2",
        include_str!("../../templates/train-multi-node.sbatch.j2"),
    ),
    (
        Some(TemplateChoice::Pretokenize),
        "pretokenize.sbatch.j2",
        include_str!("../../templates/pretokenize.sbatch.j2"),
    ),
    (
        None,
        "_header.sbatch.j2",
        include_str!("../../templates/_header.sbatch.j2"),
    ),
    (
        None,
        "_prologue.sh.j2",
        include_str!("../../templates/_prologue.sh.j2"),
    ),
    (
        None,
        "_launch.sh.j2",
        include_str!("../../templates/_launch.sh.j2"),
    ),
];

/// The loaded templates of one plan.
pub struct Templates {
    engine: Engine,
    /// template name -> file shown in errors and in the script header
    files: Vec<(String, PathBuf)>,
}

#[derive(Serialize)]
struct ScriptContext<'a> {
    sweep_version: &'a str,
    /// The sweep binary that rendered the script (jobs call it).
    sweep_bin: &'a str,
    study: &'a str,
    template: String,
    kind: UnitKind,
    run: RunInfo<'a>,
    job_name: String,
    slurm: &'a SlurmSpec,
    /// The options the header writes ([`crate::manifest::slurm_options`]).
    sbatch: Vec<(&'static str, minijinja::Value)>,
    /// A run of a packed block (`[slurm] pack`): its job step takes its own
    /// size, time and first node out of the block's allocation.
    packed: bool,
    /// The program line, as written (what a template of an earlier build
    /// launches on every task).
    command: minijinja::Value,
    /// What starts the run's processes, and the line each runs.
    launch: Launch,
}

#[derive(Serialize)]
struct RunInfo<'a> {
    id: &'a str,
    name: &'a str,
    dir: &'a Path,
}

impl Templates {
    /// Loads every template the plan's runs and stages use: the project's
    /// `templates/` copy of a built-in one where it has one (a copy that
    /// exists but cannot be read is an error, not a silent fallback), and
    /// the files manifests name.
    pub fn load(plan: &Plan) -> Result<Templates, Diagnostics> {
        let m = &plan.manifest;
        let dir = m.root.join("templates");
        let mut t = Templates {
            engine: Engine::new(),
            files: Vec::new(),
        };
        t.engine.set_fuel(Some(crate::template::SCRIPT_FUEL));
        for (_, file, text) in BUILTIN {
            let path = dir.join(file);
            let source = match read_template(&path) {
                Ok(s) => s,
                Err(ReadError::NotFound) => text.to_string(),
                Err(e) => {
                    return Err(Diagnostic::new(
                        &path,
                        format!("cannot read this template: it {e}"),
                    )
                    .with_help(format!(
                        "fix or remove it: without it, the built-in {file} is used"
                    ))
                    .into())
                }
            };
            t.add(file, &path, &source)?;
        }
        let mut chosen: Vec<(&Path, &str)> = plan
            .runs
            .iter()
            .map(|r| (&r.slurm.template, "slurm.template"))
            .chain(
                plan.stages
                    .iter()
                    .map(|s| (&s.slurm.template, "stages.pretokenize.template")),
            )
            .filter_map(|(choice, key)| match choice {
                TemplateChoice::File(p) => Some((p.as_path(), key)),
                _ => None,
            })
            .collect();
        chosen.sort_unstable();
        chosen.dedup_by(|a, b| a.0 == b.0);
        for (file, key) in chosen {
            let path = crate::util::fs::absolute(&m.root, file);
            let source = read_template(&path).map_err(|e| {
                m.locate(key)
                    .with_message(format!("cannot read template {}: it {e}", path.display()))
            })?;
            t.add(&file.to_string_lossy(), &path, &source)?;
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

    /// The name of the template a job uses (its file name for the
    /// built-in ones).
    fn resolve(slurm: &SlurmSpec) -> String {
        let choice = match &slurm.template {
            TemplateChoice::Auto if slurm.nodes.get() > 1 => &TemplateChoice::MultiNode,
            TemplateChoice::Auto => &TemplateChoice::SingleNode,
            TemplateChoice::File(p) => return p.to_string_lossy().into_owned(),
            other => other,
        };
        BUILTIN
            .iter()
            .find(|(c, _, _)| c.as_ref() == Some(choice))
            .map(|(_, f, _)| f.to_string())
            .expect("every built-in template has a file")
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
        let launch = run
            .launch_on(ExecutorKind::Slurm, sweep_bin)
            .map_err(|why| Diagnostics::from(Diagnostic::new(&plan.manifest.path, why)))?;
        self.render(plan, &run.slurm, UnitKind::Run, info, launch, sweep_bin)
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
        let line = crate::template::launch_line(&stage.command(sweep_bin));
        let (nodes, per_node) = (stage.slurm.nodes.get(), stage.slurm.ntasks_per_node.get());
        let launch = Launch::new(Launcher::Srun, nodes, per_node, &line);
        self.render(plan, &stage.slurm, UnitKind::Stage, info, launch, sweep_bin)
    }

    fn render(
        &self,
        plan: &Plan,
        slurm: &SlurmSpec,
        kind: UnitKind,
        run: RunInfo<'_>,
        launch: Launch,
        sweep_bin: &str,
    ) -> Result<String, Diagnostics> {
        let name = Self::resolve(slurm);
        let file = self.file_of(&name);
        let job_name = slurm
            .job_name
            .clone()
            .unwrap_or_else(|| plan.manifest.name.clone());
        let sbatch = crate::manifest::slurm_options::header(&crate::manifest::slurm_options::Job {
            spec: slurm,
            name: &job_name,
            dir: run.dir,
        });
        let ctx = ScriptContext {
            sweep_version: env!("CARGO_PKG_VERSION"),
            sweep_bin,
            study: &plan.manifest.name,
            template: file
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            kind,
            run,
            job_name,
            slurm,
            sbatch,
            packed: slurm.pack && kind == UnitKind::Run,
            command: minijinja::Value::from_safe_string(launch.command.clone()),
            launch,
        };
        self.engine
            .render(&name, &crate::template::context(&ctx))
            .map_err(|e| {
                let path = e.name().map(|n| self.file_of(n)).unwrap_or(file);
                template_error(&path, &e)
            })
    }
}

/// A template's text: a regular file of at most 4 MB, in UTF-8.
fn read_template(path: &Path) -> Result<String, ReadError> {
    let bytes = read_regular(path, 4 << 20, None)?;
    String::from_utf8(bytes).map_err(|_| ReadError::Io(std::io::Error::other("not UTF-8 text")))
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
