//! The expansion: combinations, derived values, configurations, ids, names and stages.

mod checks;
mod job;
mod names;
mod stages;
mod values;

use super::{Job, Plan, PretokenizedFormat, Run, Stage};
use crate::config::{DeviceKind, Features, TrainConfig};
use crate::manifest::{
    did_you_mean, join_key, known_fields, Design, Diagnostic, Diagnostics, Manifest, Mode,
    SlurmSpec, REPEAT,
};
use crate::template::{describe, Engine};
use crate::util::hash::short_id;
use crate::util::text::{describe_char, forbidden_char};
use checks::*;
use indexmap::IndexMap;
use names::*;
use rayon::prelude::*;
use serde_json::{json, Value as Json};
use stages::*;
use std::collections::HashMap;
use std::path::PathBuf;
use toml::Value;
use values::*;

pub(super) fn plan(m: Manifest, opts: &super::PlanOptions) -> Result<Plan, Diagnostics> {
    let study_dir = m.root.join("results").join(&m.name);
    let combos = combinations(&m);
    if combos.is_empty() {
        let d = m
            .source
            .at_key("sweep.exclude", "the exclude rules leave no runs");
        return Err(d.into());
    }

    let ctx = Shared::new(&m, &study_dir, opts.features)?;
    let order = run_order(&m, &combos);
    let resolved: Vec<Result<Run, Box<Diagnostic>>> = order
        .par_iter()
        .map(|(r, c, block)| {
            ctx.resolve(c, *r).map(|run| Run {
                block: *block,
                ..run
            })
        })
        .collect();

    let mut errors: Vec<Diagnostic> = Vec::new();
    let mut runs = Vec::with_capacity(resolved.len());
    for r in resolved {
        match r {
            Ok(run) => runs.push(run),
            Err(d) if !errors.contains(&d) => errors.push(*d),
            Err(_) => {}
        }
    }
    if !errors.is_empty() {
        return Err(Diagnostics(errors));
    }

    check_names(&m, &runs)?;
    check_ids(&m, &runs)?;
    super::pack::check(&m, &runs)?;
    let stages = stages(&m, &study_dir, &mut runs)?;
    // Each tokenizer read once, whatever the number of runs that share it.
    let mut vocab_sizes: HashMap<PathBuf, Option<usize>> = HashMap::new();
    let mut vocab_size = |path: &std::path::Path| {
        *vocab_sizes
            .entry(path.to_path_buf())
            .or_insert_with(|| crate::data::tokenizer::vocab_size_of(path))
    };
    for run in &mut runs {
        if let Job::Train(cfg) = &mut run.job {
            cfg.absolutize(&m.root);
            run.model = crate::data::tokenizer::model_config_with(cfg, &mut vocab_size).ok();
        }
    }
    if !opts.allow_oom {
        check_memory(&m, &runs)?;
    }
    let mut warnings = unused_axes(&m, &ctx.engine);
    warnings.extend(warnings_of(&m, &runs, opts.allow_oom));
    check_baseline(&m, &runs)?;
    Ok(Plan {
        manifest: m,
        runs,
        stages,
        study_dir,
        sweep_bin: opts.sweep_bin.clone(),
        warnings,
    })
}

/// Each run in plan order, (repeat, configuration, block): repeats interleaved against drift.
fn run_order<'c>(
    m: &Manifest,
    combos: &'c [Vec<usize>],
) -> Vec<(u32, &'c Vec<usize>, Option<super::record::DesignSlot>)> {
    (0..m.repeats)
        .flat_map(|r| {
            let within: Vec<usize> = match m.design {
                Design::Interleaved => (0..combos.len()).collect(),
                Design::Blocks => block_order(m.order_seed, r, combos.len()),
            };
            let blocked = m.design == Design::Blocks;
            within.into_iter().enumerate().map(move |(k, c)| {
                let block = blocked.then_some(super::record::DesignSlot {
                    block: r + 1,
                    position: k as u32 + 1,
                });
                (r, &combos[c], block)
            })
        })
        .collect()
}

/// The report's baseline names a configuration of the plan.
fn check_baseline(m: &Manifest, runs: &[Run]) -> Result<(), Diagnostics> {
    let Some(b) = &m.report.baseline else {
        return Ok(());
    };
    // A repeat stands for its configuration only by accident: say which.
    if let Some(r) = runs
        .iter()
        .find(|r| &r.name == b && r.configuration.name != *b && m.repeats > 1)
    {
        return Err(m
            .source
            .at_value(
                "report.baseline",
                format!(
                    "`{b}` is one repeat of the configuration `{}`: speedups are measured against a configuration, all its repeats together",
                    r.configuration.name
                ),
            )
            .with_help(format!("set `baseline = \"{}\"`", r.configuration.name))
            .into());
    }
    if !runs
        .iter()
        .any(|r| &r.name == b || r.configuration.name == *b)
    {
        let mut names: Vec<&str> = runs.iter().map(|r| r.configuration.name.as_str()).collect();
        names.dedup();
        let help = match did_you_mean(b, names.iter().copied()) {
            Some(s) => format!("did you mean `{s}`?"),
            None => format!("`sweep plan` lists the run names ({} runs)", names.len()),
        };
        return Err(m
            .source
            .at_value(
                "report.baseline",
                format!("no run or configuration is named `{b}`"),
            )
            .with_help(help)
            .into());
    }
    Ok(())
}

/// Block `r`'s order of `n` configurations: Fisher–Yates on ChaCha8 from (`seed`, `r`), the
/// same on any machine and version.
pub(super) fn block_order(seed: u64, r: u32, n: usize) -> Vec<usize> {
    use rand_chacha::rand_core::{RngCore, SeedableRng};
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..12].copy_from_slice(&r.to_le_bytes());
    let mut rng = rand_chacha::ChaCha8Rng::from_seed(key);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        // Uniform in 0..=i by rejection (no modulo bias).
        let bound = i as u64 + 1;
        let zone = u64::MAX - u64::MAX % bound;
        let j = loop {
            let x = rng.next_u64();
            if x < zone {
                break (x % bound) as usize;
            }
        };
        order.swap(i, j);
    }
    order
}

/// Row indices, one per axis, of every combination no rule excludes; the first axis slowest.
fn combinations(m: &Manifest) -> Vec<Vec<usize>> {
    let lens: Vec<usize> = m.axes.iter().map(|a| a.rows.len()).collect();
    let total: usize = lens.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut idx = vec![0usize; lens.len()];
    for _ in 0..total {
        if !excluded(m, &idx) {
            out.push(idx.clone());
        }
        for a in (0..idx.len()).rev() {
            idx[a] += 1;
            if idx[a] < lens[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    out
}

fn excluded(m: &Manifest, idx: &[usize]) -> bool {
    m.exclude.iter().any(|rule| {
        rule.conditions.iter().all(|(key, want)| {
            m.axes.iter().zip(idx).any(|(axis, &row)| {
                axis.keys
                    .iter()
                    .position(|k| k == key)
                    .is_some_and(|col| &axis.rows[row][col] == want)
            })
        })
    })
}

/// What every run's resolution needs, computed once.
struct Shared<'a> {
    m: &'a Manifest,
    study_dir: PathBuf,
    engine: Engine,
    slurm_table: toml::Table,
    train_fields: Vec<String>,
    /// What the binary that job scripts run was built with.
    features: Features,
    /// Where `[defaults]` alone fails as a trainer configuration: the key (`None`: a type error).
    defaults_error: Option<Option<&'static str>>,
    /// Whether the name template writes `repeat` (else repeats get `-r<k>`).
    name_uses_repeat: bool,
}

/// One run's values as assembled: its axis and derived values, `[defaults]` and `[slurm]` tables.
struct Assembly {
    params: IndexMap<String, Json>,
    table: toml::Table,
    slurm: toml::Table,
}

impl<'a> Shared<'a> {
    fn new(
        m: &'a Manifest,
        study_dir: &std::path::Path,
        features: Features,
    ) -> Result<Self, Diagnostics> {
        let mut engine = Engine::new();
        if let Mode::Command(cmd) = &m.mode {
            engine
                .add_command("command", cmd)
                .map_err(|e| m.source.at_value("command", describe(&e)))?;
        }
        let slurm_table = match Value::try_from(&m.slurm) {
            Ok(Value::Table(t)) => t,
            other => {
                let why = other.err().map(|e| e.to_string()).unwrap_or_default();
                return Err(m
                    .source
                    .at_key(
                        "slurm",
                        format!("[slurm] does not convert to a table: {why}"),
                    )
                    .into());
            }
        };
        let name_uses_repeat = m
            .name_template
            .as_deref()
            .is_some_and(|t| engine.uses(t, REPEAT));
        Ok(Shared {
            m,
            study_dir: study_dir.to_path_buf(),
            engine,
            slurm_table,
            train_fields: known_fields::<TrainConfig>(),
            features,
            defaults_error: check_train(&m.defaults, features).err().map(|(key, _)| key),
            name_uses_repeat,
        })
    }

    /// A run's name, its configuration's name, and the name as written where it was made safe.
    fn names(
        &self,
        ctx: &Json,
        params: &IndexMap<String, Json>,
        repeat: u32,
    ) -> Result<(String, String, Option<String>), Box<Diagnostic>> {
        let repeated = self.m.repeats > 1;
        let written = self.name_as_written(ctx, params)?;
        let rendered = crate::util::name::replace_unsafe(written.trim());
        let sanitized_from = (written.trim() != rendered).then_some(written);
        let (name, config_name) = match (repeated, self.name_uses_repeat) {
            (false, _) => (rendered.clone(), rendered),
            (true, false) => (format!("{rendered}-r{repeat}"), rendered),
            // The template writes the repeat: the configuration is named after its first repeat.
            (true, true) => {
                let mut first = ctx.clone();
                first["repeat"] = json!(0);
                (rendered, self.name(&first, params)?)
            }
        };
        Ok((name, config_name, sanitized_from))
    }

    fn resolve(&self, combo: &[usize], repeat: u32) -> Result<Run, Box<Diagnostic>> {
        let m = self.m;
        let mut a = self.assemble(combo);
        let repeated = m.repeats > 1;
        let mut slurm = self.slurm(&a)?;

        // The context of derived values, names and commands.
        let mut train = match &m.mode {
            Mode::Train(_) => Some(self.train_config(&a.table, &a.params)?),
            Mode::Command(_) => None,
        };
        let mut ctx = match &train {
            Some(cfg) => config_context(cfg),
            None => to_json(&Value::Table(a.table.clone())),
        };
        ctx["slurm"] = serde_json::to_value(&slurm).expect("slurm serialises");
        ctx["study"] = json!(m.name);
        ctx["repeat"] = json!(repeat);
        if self.derive(&mut a, &mut ctx, train.is_some())? {
            train = Some(self.train_config(&a.table, &a.params)?);
        }
        if let Some(cfg) = train.as_mut().filter(|_| m.seed_per_repeat) {
            // Any seed is a seed: past u64::MAX it wraps to 0.
            cfg.seed = cfg.seed.wrapping_add(u64::from(repeat));
        }
        if u32::try_from(slurm.tasks()).is_err() {
            let msg = format!(
                "`slurm.nodes` × `slurm.ntasks_per_node` = {} × {} tasks, more than a job can have",
                slurm.nodes, slurm.ntasks_per_node
            );
            return Err(self.error_in(&a.params, Some("slurm.nodes"), &msg));
        }
        if let Some(cfg) = &train {
            self.ranks(&a, &mut slurm, cfg)?;
        }
        let launcher = match train {
            Some(_) => None,
            None => self.launcher(&a, &slurm)?,
        };

        let identity = self.identity(&a, &slurm, train.as_ref());
        // A repeat is a run of its own.
        let config = identity.hash(None);
        let hashed = match repeated {
            true => identity.hash(Some(repeat)),
            false => config.clone(),
        };
        let id = hashed.id.clone();
        ctx["id"] = json!(id);
        let (name, config_name, sanitized_from) = self.names(&ctx, &a.params, repeat)?;
        if repeated {
            a.params.insert(REPEAT.into(), json!(repeat));
        }
        let name = self.checked_name(name, &a.params)?;
        if train.is_none() {
            // After the id: a report setting is no new measurement.
            for (key, figure) in m.report.per_run() {
                let value = self.per_run_figure(key, figure, &ctx, &a.params)?;
                a.params.insert(key.into(), json!(value));
            }
        }
        let configuration = super::record::Configuration {
            id: config.id,
            name: config_name,
        };
        let dir = self.study_dir.join(&name);
        let job = match train {
            Some(cfg) => Job::Train(Box::new(cfg)),
            None => {
                ctx["run"] = json!({ "id": id, "name": name, "dir": dir });
                Job::Command(self.command(&ctx, &a.params)?)
            }
        };
        let watch =
            crate::plan::launch::Watch::of(&m.watchdog, &job, m.report.line_pattern.as_deref());
        Ok(Run {
            id,
            digest: hashed.digest,
            identity: hashed.value,
            name,
            sanitized_from,
            configuration,
            params: a.params,
            job,
            launcher,
            watch,
            slurm,
            stage: None,
            dir,
            block: None,
            model: None,
        })
    }

    /// The axis values of one combination, set into copies of `[defaults]` and `[slurm]`.
    fn assemble(&self, combo: &[usize]) -> Assembly {
        let mut a = Assembly {
            params: IndexMap::new(),
            table: self.m.defaults.clone(),
            slurm: self.slurm_table.clone(),
        };
        for (axis, &row) in self.m.axes.iter().zip(combo) {
            for (key, value) in axis.keys.iter().zip(&axis.rows[row]) {
                a.params.insert(key.clone(), to_json(value));
                match key.strip_prefix("slurm.") {
                    Some(field) => {
                        a.slurm.insert(field.to_string(), value.clone());
                    }
                    None => set_dotted(&mut a.table, key, value.clone()),
                }
            }
        }
        a
    }

    /// Evaluates the derived values into `ctx` and the run's parameters (trainer keys into its
    /// table); whether the trainer configuration changed.
    fn derive(
        &self,
        a: &mut Assembly,
        ctx: &mut Json,
        train: bool,
    ) -> Result<bool, Box<Diagnostic>> {
        let mut changed = false;
        for d in &self.m.derived {
            let path = join_key("sweep.derived", &d.key);
            let fail = |why: String| {
                let mut diag = self
                    .m
                    .source
                    .at_value(&path, format!("derived value `{}` {why}", d.key));
                diag.help = Some(in_the_run(&a.params));
                Box::new(diag)
            };
            let value = self
                .engine
                .eval(&d.expr, &crate::template::context(&*ctx))
                .map_err(|e| fail(format!("failed: {}", describe(&e))))?;
            let value =
                serde_json::to_value(&value).map_err(|e| fail(format!("cannot be stored: {e}")))?;
            let as_toml = json_to_toml(&value).map_err(|why| fail(why.to_string()))?;
            if let Json::String(s) = &value {
                if let Some(c) = forbidden_char(s, false) {
                    return Err(fail(format!(
                        "came out as `{}`, which contains {}",
                        s.escape_debug(),
                        describe_char(c)
                    )));
                }
            }
            if train && self.train_fields.contains(&d.key) {
                a.table.insert(d.key.clone(), as_toml);
                if let Err(e) = parse_train(&a.table) {
                    return Err(fail(format!(
                        "does not fit the trainer key `{}`: {e}",
                        d.key
                    )));
                }
                changed = true;
            }
            ctx[d.key.as_str()] = value.clone();
            a.params.insert(d.key.clone(), value);
        }
        Ok(changed)
    }

    /// A `[report]` figure for one run: its number or evaluated expression, within bounds.
    fn per_run_figure(
        &self,
        key: &str,
        figure: &crate::manifest::PerRun,
        ctx: &Json,
        params: &IndexMap<String, Json>,
    ) -> Result<f64, Box<Diagnostic>> {
        let fail = |why: String| {
            let mut d = self
                .m
                .source
                .at_value(&format!("report.{key}"), format!("`{key}` {why}"));
            d.help = Some(in_the_run(params));
            Box::new(d)
        };
        if params.contains_key(key) {
            return Err(fail("is computed from the run's values, and the run already has a value of that name: rename the axis or derived value".into()));
        }
        let (what, most) = crate::manifest::ReportSpec::bounds(key);
        let (value, written) = match figure {
            crate::manifest::PerRun::Number(n) => (minijinja::Value::from(*n), n.to_string()),
            crate::manifest::PerRun::Expr(expr) => (
                self.engine
                    .eval(expr, &crate::template::context(ctx))
                    .map_err(|e| fail(format!("failed: {}", describe(&e))))?,
                expr.clone(),
            ),
        };
        match f64::try_from(value.clone()) {
            Ok(t) if t.is_finite() && t > 0.0 && t <= most => Ok(t),
            _ => Err(fail(format!(
                "= `{written}` came out as {value}: it must be a number of {what} above 0 (at most {most:e})"
            ))),
        }
    }

    fn command(
        &self,
        ctx: &Json,
        params: &IndexMap<String, Json>,
    ) -> Result<String, Box<Diagnostic>> {
        let cmd = self
            .engine
            .render("command", &crate::template::context(ctx))
            .map_err(|e| {
                let mut d = self.m.source.at_value(
                    "command",
                    format!("the command failed to render: {}", describe(&e)),
                );
                d.help = Some(in_the_run(params));
                d
            })?;
        Ok(cmd.trim().to_string())
    }

    fn train_config(
        &self,
        table: &toml::Table,
        params: &IndexMap<String, Json>,
    ) -> Result<TrainConfig, Box<Diagnostic>> {
        check_train(table, self.features).map_err(|(key, msg)| self.error_in(params, key, &msg))
    }

    /// An error in one run's configuration, at the axis value causing it, else at the key.
    fn error_in(
        &self,
        params: &IndexMap<String, Json>,
        key: Option<&str>,
        msg: &str,
    ) -> Box<Diagnostic> {
        if self.defaults_error.is_some_and(|k| k == key) {
            let mut d = self.m.locate(key.unwrap_or("defaults"));
            d.message = format!("invalid run configuration: {}", msg.trim());
            return Box::new(d);
        }
        let culprit = (self.defaults_error.is_none())
            .then(|| {
                self.m.axes.iter().find_map(|axis| {
                    axis.keys.iter().zip(&axis.paths).find_map(|(k, path)| {
                        let value = params.get(k)?;
                        let row = axis.rows.iter().position(|r| {
                            r.iter()
                                .zip(&axis.keys)
                                .any(|(v, kk)| kk == k && to_json(v) == *value)
                        })?;
                        (!self.fine_alone(k, value)?)
                            .then(|| self.m.source.at_value(&format!("{path}[{row}]"), ""))
                    })
                })
            })
            .flatten();
        let mut d = culprit.unwrap_or_else(|| self.m.locate(key.unwrap_or("defaults")));
        d.message = format!("invalid run configuration: {}", msg.trim());
        if !params.is_empty() {
            d.help = Some(in_the_run(params));
        }
        Box::new(d)
    }

    /// Whether one axis value alone gives a valid configuration (`None`: no TOML form).
    fn fine_alone(&self, key: &str, value: &Json) -> Option<bool> {
        let value = json_to_toml(value).ok()?;
        Some(match key.strip_prefix("slurm.") {
            Some(field) => {
                let mut t = self.slurm_table.clone();
                t.insert(field.to_string(), value);
                Value::Table(t).try_into::<SlurmSpec>().is_ok()
            }
            None => {
                let mut table = self.m.defaults.clone();
                set_dotted(&mut table, key, value);
                check_train(&table, self.features).is_ok()
            }
        })
    }

    fn name(&self, ctx: &Json, params: &IndexMap<String, Json>) -> Result<String, Box<Diagnostic>> {
        Ok(crate::util::name::replace_unsafe(
            self.name_as_written(ctx, params)?.trim(),
        ))
    }

    /// The run name as written, before it is made a directory name.
    fn name_as_written(
        &self,
        ctx: &Json,
        params: &IndexMap<String, Json>,
    ) -> Result<String, Box<Diagnostic>> {
        Ok(match &self.m.name_template {
            Some(t) => self
                .engine
                .eval(t, &crate::template::context(ctx))
                .map(|v| v.to_string())
                .map_err(|e| {
                    self.m.source.at_value(
                        "sweep.name",
                        format!("the run name failed to render: {}", describe(&e)),
                    )
                })?,
            None => default_name(self.m, params),
        })
    }

    /// A run's final name, if it can name a run directory.
    fn checked_name(
        &self,
        name: String,
        params: &IndexMap<String, Json>,
    ) -> Result<String, Box<Diagnostic>> {
        let why = match crate::util::name::check(&name) {
            Err(why) => why,
            Ok(()) if crate::layout::reserved(&name) => {
                format!("`{name}` is reserved for the study's own directories")
            }
            Ok(()) => return Ok(name),
        };
        let at = if self.m.name_template.is_some() {
            "sweep.name"
        } else {
            "sweep"
        };
        let shown: String = name.chars().take(60).collect();
        Err(self
            .m
            .source
            .at_value(
                at,
                format!(
                    "the run name `{}` cannot name a run directory: {why}",
                    shown.escape_debug()
                ),
            )
            .with_help(in_the_run(params))
            .into())
    }
}

/// A trainer configuration as names and derived values see it: every key, defaults included.
fn config_context(cfg: &TrainConfig) -> Json {
    let mut v = serde_json::to_value(cfg).expect("config serialises");
    let left_out = [
        ("zero", json!(cfg.zero)),
        ("data_order", json!(cfg.data_order)),
    ];
    if let Some(fields) = v.as_object_mut() {
        for (key, value) in left_out {
            fields.entry(key).or_insert(value);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::block_order;

    #[test]
    fn block_orders_are_permutations_fixed_by_the_seed() {
        for n in [0, 1, 2, 5, 40] {
            let mut o = block_order(3, 1, n);
            o.sort_unstable();
            assert_eq!(o, (0..n).collect::<Vec<_>>());
        }
        // Pinned: a seed gives these orders on any machine and sweep version.
        assert_eq!(block_order(0, 0, 6), PINNED);
        assert_eq!(block_order(0, 0, 6), block_order(0, 0, 6));
        assert_ne!(block_order(0, 0, 6), block_order(0, 1, 6), "another block");
        assert_ne!(block_order(0, 0, 6), block_order(1, 0, 6), "another seed");
        // Every position is as likely for every configuration.
        let mut first = [0usize; 4];
        for r in 0..4000 {
            first[block_order(9, r, 4)[0]] += 1;
        }
        assert!(first.iter().all(|&c| (900..1100).contains(&c)), "{first:?}");
    }

    const PINNED: [usize; 6] = [2, 3, 1, 4, 5, 0];

    /// Keys a run's config leaves out at their default still name runs.
    #[test]
    fn keys_left_out_at_their_default_name_runs() {
        let cfg = crate::config::TrainConfig::default();
        let ctx = super::config_context(&cfg);
        assert_eq!(
            (ctx["zero"].clone(), ctx["data_order"].clone()),
            (0.into(), "global".into())
        );
        let written = toml::to_string(&cfg).unwrap();
        assert!(
            !written.contains("zero") && !written.contains("data_order"),
            "{written}"
        );
    }

    /// A run's model shape is resolved when it is planned: a preset without
    /// a vocabulary takes its tokenizer's, and a tokenizer that cannot be
    /// read leaves the run without a shape (nor a memory estimate) instead
    /// of failing the plan.
    #[test]
    fn each_run_carries_its_model_with_its_tokenizers_vocabulary() {
        use crate::config::RuntimeOptions;
        use crate::plan::{Plan, PlanOptions};
        let dir = tempfile::tempdir().unwrap();
        let tokenizer =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(crate::config::DEFAULT_TOKENIZER);
        let text = format!(
            "name = \"m\"\n[defaults]\nmodel = \"tiny\"\ndataset = \"d.parquet\"\n\
             device = \"cuda\"\ngpu = \"H100\"\n[sweep.grid]\ntokenizer = [{:?}, \"missing.json\"]\n",
            tokenizer.display().to_string()
        );
        let path = dir.path().join("m.toml");
        std::fs::write(&path, text).unwrap();
        let m = crate::manifest::Manifest::load(&path, dir.path()).unwrap();
        let opts = PlanOptions::new(true, &RuntimeOptions::default());
        let plan = Plan::new(
            m,
            &PlanOptions {
                features: crate::config::Features::ALL,
                ..opts
            },
        )
        .unwrap();
        let vocab = crate::data::tokenizer::vocab_size_of(&tokenizer).unwrap();
        let [read, missing] = &plan.runs[..] else {
            panic!("two runs")
        };
        let model = read
            .model
            .as_ref()
            .expect("the tokenizer's run has a shape");
        assert_eq!((model.vocab_size, model.dim), (vocab, 128));
        assert!(read.memory(&plan.manifest.hints).is_some());
        assert!(missing.model.is_none());
        assert!(missing.memory(&plan.manifest.hints).is_none());
    }
}
