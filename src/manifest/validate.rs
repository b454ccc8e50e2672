//! The checks a manifest passes before it becomes a [`Manifest`], every error at its file,
//! line and key.

use super::*;

/// Checks one manifest's document, collecting every error, each at its key.
pub(super) struct Validator<'a, 'i> {
    pub(super) source: &'a ManifestText,
    pub(super) doc: &'a DeTable<'i>,
    pub(super) errors: Vec<Diagnostic>,
    pub(super) engine: Engine,
}

impl Validator<'_, '_> {
    pub(super) fn err(&mut self, d: Diagnostic) {
        self.errors.push(d);
    }

    pub(super) fn at_key(&mut self, path: &str, msg: impl Into<String>) {
        let d = self.source.at_key(path, msg);
        self.err(d);
    }

    pub(super) fn at_value(&mut self, path: &str, msg: impl Into<String>) {
        let d = self.source.at_value(path, msg);
        self.err(d);
    }

    pub(super) fn at_value_help(
        &mut self,
        path: &str,
        msg: impl Into<String>,
        help: impl Into<String>,
    ) {
        let d = self.source.at_value(path, msg).with_help(help);
        self.err(d);
    }

    /// Every key the file's structure refuses (misspelt, wrong type), found alone; when only keys
    /// inside sections fail, the rest is validated too. `first`: serde's error for the document,
    /// said when no key fails alone (a missing key).
    pub(super) fn key_errors(
        &mut self,
        doc: &Spanned<DeTable<'_>>,
        first: toml::de::Error,
        root: &Path,
    ) {
        let found = isolate::key_errors::<ManifestFile>(doc);
        if found.is_empty() {
            let d = self.source.from_toml_error(&first, explain_key);
            self.err(d);
            return;
        }
        for f in &found {
            let d = self.source.from_toml_error(&f.error, explain_key);
            self.err(d);
        }
        // A wrong top-level key changes what every other check means: stop rather than echo it.
        if found.iter().any(|f| f.path.len() < 2) {
            return;
        }
        let paths: Vec<Vec<String>> = found.into_iter().map(|f| f.path).collect();
        let rest = isolate::without(doc, &paths);
        if let Ok(file) = ManifestFile::deserialize(toml::de::Deserializer::from(rest)) {
            let path = self.source.path.clone();
            self.validate(file, &path, root, String::new());
        }
        self.errors.sort_by_key(|d| (d.line, d.column));
    }

    pub(super) fn spanned_table(&self, key: &str) -> Option<Spanned<DeTable<'_>>> {
        self.doc.get(key).and_then(|v| match v.get_ref() {
            DeValue::Table(t) => Some(Spanned::new(v.span(), t.clone())),
            _ => None,
        })
    }

    /// Whether a dotted key is written in a top-level table of the file.
    pub(super) fn written(&self, table: &str, dotted: &str) -> bool {
        let mut cur = match self.doc.get(table).map(|v| v.get_ref()) {
            Some(DeValue::Table(t)) => t,
            _ => return false,
        };
        let parts: Vec<&str> = dotted.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            match cur.get(*part).map(|v| v.get_ref()) {
                Some(DeValue::Table(t)) if i + 1 < parts.len() => cur = t,
                Some(_) if i + 1 == parts.len() => return true,
                _ => return false,
            }
        }
        false
    }

    /// A `command` sweep, or the built-in trainer with its defaults.
    pub(super) fn mode(&mut self, command: &Option<String>) -> Mode {
        match command {
            Some(cmd) => {
                if cmd.trim().is_empty() {
                    self.at_value("command", "`command` is empty");
                } else if let Err(e) = self.engine.check_template(cmd) {
                    self.at_value(
                        "command",
                        format!("the command template does not compile: {}", describe(&e)),
                    );
                }
                Mode::Command(cmd.clone())
            }
            None => Mode::Train(Box::new(self.train_defaults())),
        }
    }

    /// `[report]`'s keys for foreign logs (roles and charts name pattern groups; FLOPs from a
    /// number, preset or known device), and `[environment]` (a one-line system name, probes with
    /// plain names).
    pub(super) fn check_environment(&mut self, e: &EnvironmentSpec) {
        if let Some(system) = &e.system {
            let bad = system.trim().is_empty()
                || system.chars().count() > 100
                || system.chars().any(|c| c.is_control());
            if bad {
                self.at_value(
                    "environment.system",
                    "`system` is one line of at most 100 characters, not empty".to_string(),
                );
            }
        }
        if e.probes.len() > schema::MAX_PROBES {
            self.at_key(
                "environment.probes",
                format!(
                    "{} probes: at most {} (each runs at the start of every job)",
                    e.probes.len(),
                    schema::MAX_PROBES
                ),
            );
        }
        for (name, command) in &e.probes {
            let key = join_key("environment.probes", name);
            if let Err(why) = crate::util::name::check(name) {
                self.at_key(&key, format!("probe name: {why}"));
            } else if command.trim().is_empty() {
                self.at_value(&key, format!("probe `{name}` has no command"));
            }
        }
    }

    /// The pattern's foreign groups make columns of their own: none may be the report's or an axis's.
    pub(super) fn check_pattern_groups(&mut self, r: &ReportSpec, axes: &[Axis]) {
        let keys: Vec<&str> = axes
            .iter()
            .flat_map(|a| a.keys.iter().map(String::as_str))
            .collect();
        self.report_faults(r.collisions(&keys));
    }

    /// `[report]`'s faults, each at its key or value.
    fn report_faults(&mut self, faults: Vec<report::Fault>) {
        for f in faults {
            let path = format!("report.{}", f.key);
            let d = match f.at_value {
                true => self.source.at_value(&path, f.why),
                false => self.source.at_key(&path, f.why),
            };
            self.err(match f.help {
                Some(h) => d.with_help(h),
                None => d,
            });
        }
    }

    pub(super) fn check_report(&mut self, r: &ReportSpec, command: bool) {
        let foreign = [
            ("memory", r.memory.is_some()),
            ("throughput", r.throughput.is_some()),
            ("step_time", r.step_time.is_some()),
            ("tokens_per_step", r.tokens_per_step.is_some()),
            ("charts", !r.charts.is_empty()),
            ("flops_per_token", r.flops_per_token.is_some()),
            ("model", r.model.is_some()),
            ("sequence_length", r.sequence_length.is_some()),
            ("gpu", r.gpu.is_some()),
            ("peak_flops", r.peak_flops.is_some()),
        ];
        for (key, set) in foreign {
            let needs_pattern = matches!(
                key,
                "memory" | "throughput" | "step_time" | "tokens_per_step" | "charts"
            );
            if set && (!command || (needs_pattern && r.line_pattern.is_none())) {
                let why = match command {
                    false => "the built-in trainer logs its memory, throughput and FLOPs itself: it is for `command` sweeps",
                    true => "it names a group of `[report] line_pattern`, which is not set",
                };
                self.at_key(&format!("report.{key}"), format!("`{key}`: {why}"));
            }
        }
        self.report_faults(r.faults());
    }

    /// `max_runs` and `repeats`, or None (with the error) where out of bounds.
    pub(super) fn runs_and_repeats(
        &mut self,
        sweep: &schema::SweepFile,
        mode: &Mode,
        pack: bool,
    ) -> Option<(u64, u32)> {
        let max_runs = sweep.max_runs.unwrap_or(DEFAULT_MAX_RUNS);
        if max_runs > MAX_MAX_RUNS {
            self.at_value_help(
                "sweep.max_runs",
                format!("`max_runs = {max_runs}` is more than {MAX_MAX_RUNS}"),
                "a study of a million runs needs gigabytes to plan; split it into several studies",
            );
            return None;
        }
        let repeats = sweep.repeats.unwrap_or(1);
        if repeats == 0 {
            let d = self
                .source
                .at_value("sweep.repeats", "`repeats` must be at least 1");
            self.err(d);
            return None;
        }
        if sweep.order_seed.is_some() && sweep.design != Some(Design::Blocks) {
            let d = self.source.at_key(
                "sweep.order_seed",
                "`order_seed` draws the orders of a blocked design: set `design = \"blocks\"` too",
            );
            self.err(d);
            return None;
        }
        if pack && sweep.design != Some(Design::Blocks) {
            self.at_value_help(
                "slurm.pack",
                "`pack` runs each block of a blocked design as one job, and this study has no blocks",
                "set `design = \"blocks\"` in [sweep] (a block is one run of every configuration; `repeats` blocks)",
            );
            return None;
        }
        if sweep.seed_per_repeat && matches!(mode, Mode::Command(_)) {
            let d = self.source.at_value(
                "sweep.seed_per_repeat",
                "`seed_per_repeat` sets the built-in trainer's seed; a `command` sweep can pass `{{ repeat }}` to its program instead",
            );
            self.err(d);
            return None;
        }
        Some((max_runs, repeats))
    }

    /// The bounded counts of the other sections, the log pattern, sbatch options, environment names.
    pub(super) fn check_sections(&mut self, file: &ManifestFile) {
        // Counts that size thread pools, allocations and loops, bounded here.
        for (path, v, least, most) in [
            ("local.parallel", file.local.parallel, 1, MAX_PARALLEL),
            (
                "local.threads",
                file.local.threads,
                0,
                crate::config::MAX_THREADS,
            ),
            (
                "stages.pretokenize.row_group_size",
                file.stages.pretokenize.row_group_size,
                1,
                crate::data::pretokenized::MAX_ROW_GROUP_SIZE,
            ),
            (
                "report.skip_first",
                file.report.skip_first,
                0,
                crate::config::MAX_STEPS,
            ),
        ] {
            if !(least..=most).contains(&v) {
                let key = path.rsplit('.').next().unwrap_or(path);
                self.at_value(
                    path,
                    format!("`{key}` must be a whole number in {least}..={most}, not {v}"),
                );
            }
        }
        if let Some(p) = &file.report.line_pattern {
            if let Err(e) = crate::util::text::regex(p) {
                self.at_value(
                    "report.line_pattern",
                    format!("not a valid regular expression: {e}"),
                );
            }
        }
        self.check_report(&file.report, file.command.is_some());
        self.check_environment(&file.environment);
        for (i, line) in file.slurm.extra_sbatch.iter().enumerate() {
            if let Some((why, help)) = super::slurm_options::sbatch_line_fault(line, &file.slurm) {
                self.at_value_help(&format!("slurm.extra_sbatch[{i}]"), why, help);
            }
        }
        for (i, arg) in file.slurm.srun_args.iter().enumerate() {
            if let Some((why, help)) = super::slurm_options::srun_arg_fault(arg, &file.slurm) {
                self.at_value_help(&format!("slurm.srun_args[{i}]"), why, help);
            }
        }
        if let Some((i, why, help)) =
            super::slurm_options::srun_program_fault(&file.slurm.srun_args)
        {
            self.at_value_help(&format!("slurm.srun_args[{i}]"), why, help);
        }
        for (k, _) in &file.slurm.env {
            if !is_env_name(k) {
                self.at_key(
                    &join_key("slurm.env", k),
                    format!("`{k}` is not a valid environment variable name"),
                );
            } else if let Some((why, help)) = super::slurm_options::env_fault(k) {
                let d = self.source.at_key(&join_key("slurm.env", k), why);
                self.err(d.with_help(help));
            }
        }
    }

    pub(super) fn validate(
        &mut self,
        file: ManifestFile,
        path: &Path,
        root: &Path,
        sha256: String,
    ) -> Option<Manifest> {
        self.check_name(&file.name);
        let hints = self.hints(&file.defaults, &file.plan);
        let mode = self.mode(&file.command);
        let axes = self.axes(&file.sweep.grid, &file.sweep.zip);
        let (max_runs, repeats) = self.runs_and_repeats(&file.sweep, &mode, file.slurm.pack)?;
        if !self.check_size(&axes, max_runs, repeats) {
            // Every later check walks the axes: stop before a huge sweep does.
            return None;
        }
        for axis in &axes {
            for (key, path) in axis.keys.iter().zip(&axis.paths) {
                self.check_axis_key(&mode, key, path, axis);
            }
        }
        let exclude = self.exclude(&file.sweep.exclude, &axes);
        let derived = self.derived(&file.sweep.derived, &axes, &file.defaults);
        if let Some(name) = &file.sweep.name {
            if let Err(e) = self.engine.check(name) {
                self.at_value(
                    "sweep.name",
                    format!("the run-name template does not compile: {}", describe(&e)),
                );
            }
        }
        self.check_sections(&file);
        self.check_pattern_groups(&file.report, &axes);
        if !self.errors.is_empty() {
            return None;
        }
        Some(Manifest {
            path: path.to_path_buf(),
            root: root.to_path_buf(),
            sha256,
            source: self.source.clone(),
            name: file.name,
            description: file.description,
            mode,
            executor: file.executor,
            defaults: file.defaults,
            axes,
            exclude,
            derived,
            name_template: file.sweep.name,
            repeats,
            seed_per_repeat: file.sweep.seed_per_repeat,
            design: file.sweep.design.unwrap_or_default(),
            order_seed: file.sweep.order_seed.unwrap_or(0),
            slurm: file.slurm,
            local: file.local,
            stages: file.stages,
            report: file.report,
            environment: file.environment,
            watchdog: file.watchdog,
            hints,
        })
    }

    /// `[plan]`, validated; a hint key in `[defaults]` is an error (`[plan]` holds it).
    pub(super) fn hints(&mut self, defaults: &toml::Table, plan: &PlanHints) -> PlanHints {
        for key in hints::KEYS
            .into_iter()
            .filter(|k| defaults.contains_key(*k))
        {
            self.at_key_help(
                &join_key("defaults", key),
                format!("`{key}` is a hint for `sweep plan`, not part of a run's configuration"),
                "move it to [plan]",
            );
        }
        if let Err(e) = plan.validate() {
            self.at_value(&join_key("plan", e.key), e.message);
        }
        plan.clone()
    }

    /// Every key and string against [`forbidden_char`]: in `#SBATCH` and shell lines a line break
    /// starts a directive or command of its own whatever the quoting.
    pub(super) fn check_characters(&mut self) {
        let mut found = Vec::new();
        walk_strings(self.doc, "", &mut found);
        for (path, is_key, text) in found {
            let multiline = !is_key && MULTILINE_KEYS.iter().any(|k| key_under(&path, k));
            let Some(c) = forbidden_char(&text, multiline) else {
                continue;
            };
            let what = if is_key { "key" } else { "value" };
            let help = if multiline {
                "this value may span lines (newline and tab), but holds no other control characters"
            } else {
                "a value that reaches a job script must be one line of printable text: \
                 no newline, carriage return, tab, NUL or other control character \
                 (a line break in a job script starts an #SBATCH directive or a command of its own)"
            };
            let msg = format!("this {what} contains {}", describe_char(c));
            let d = if is_key {
                self.source.at_key(&path, msg)
            } else {
                self.source.at_value(&path, msg)
            };
            self.err(d.with_help(help));
        }
    }

    /// Counts the runs from the axis lengths (saturating) and refuses more than `max_runs`.
    pub(super) fn check_size(&mut self, axes: &[Axis], max_runs: u64, repeats: u32) -> bool {
        let count = axes.iter().fold(u128::from(repeats), |n, a| {
            n.saturating_mul(a.rows.len() as u128)
        });
        if count <= u128::from(max_runs) {
            return true;
        }
        let shown = if count == u128::MAX {
            format!("more than {}", u128::MAX)
        } else {
            count.to_string()
        };
        let mut sizes: Vec<String> = axes
            .iter()
            .map(|a| format!("{} ({})", a.keys.join(" + "), a.rows.len()))
            .collect();
        if repeats > 1 {
            sizes.push(format!("repeats ({repeats})"));
        }
        let at = if self.source.has("sweep.max_runs") {
            "sweep.max_runs"
        } else {
            "sweep"
        };
        let d = self
            .source
            .at_key(
                at,
                format!(
                    "the sweep expands to {shown} runs ({} ax{}: {}), more than max_runs = {max_runs}",
                    axes.len(),
                    if axes.len() == 1 { "is" } else { "es" },
                    sizes.join(" × ")
                ),
            )
            .with_help(
                "shorten the axes, pair values with [[sweep.zip]] instead of crossing them, \
                 or raise `[sweep] max_runs` if the sweep is meant to be this large",
            );
        self.err(d);
        false
    }

    pub(super) fn check_name(&mut self, name: &str) {
        if let Err(why) = crate::util::name::check(name) {
            self.at_value_help(
                "name",
                format!("this cannot name a study directory: {why}"),
                format!(
                    "use up to {} letters, digits, `.`, `_` and `-`, not starting with `.` (it becomes results/<name>/)",
                    crate::util::name::MAX_LEN
                ),
            );
        }
    }

    /// `[defaults]` as the trainer's configuration, type-checked with spans.
    pub(super) fn train_defaults(&mut self) -> TrainConfig {
        let Some(mut table) = self.spanned_table("defaults") else {
            return TrainConfig::default();
        };
        // Hints are the plan's (see `hints`), not the trainer's.
        for key in hints::KEYS {
            table.get_mut().remove(key);
        }
        match TrainConfig::deserialize(table.clone().into_deserializer()) {
            Ok(cfg) => cfg,
            Err(e) => {
                // Each wrong key of [defaults], not only the first.
                let found = isolate::key_errors::<TrainConfig>(&table);
                let errors = match found.is_empty() {
                    true => vec![e],
                    false => found.into_iter().map(|f| f.error).collect(),
                };
                for e in errors {
                    let mut d = self.source.from_toml_error(&e, explain_key);
                    if d.help.is_none() {
                        d.help = Some("see the manifest reference in docs/manifest.md".into());
                    }
                    self.err(d);
                }
                TrainConfig::default()
            }
        }
    }
}

/// Flattens nested tables into dotted keys (`{slurm = {nodes = ..}}` and `"slurm.nodes"` alike).
pub(super) fn flatten(
    table: &toml::Table,
    prefix: &str,
    path: &str,
) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let p = join_key(path, k);
        match v {
            Value::Table(t) => out.extend(flatten(t, &key, &p)),
            _ => out.push((key, p, v.clone())),
        }
    }
    out
}

/// The values that may span lines: the command (one quoted `bash -c` word), the description,
/// and name and derived-value templates (checked per run).
pub(super) const MULTILINE_KEYS: &[&str] =
    &["command", "description", "sweep.name", "sweep.derived"];

/// Whether `path` is `key` or lies below it.
pub(super) fn key_under(path: &str, key: &str) -> bool {
    path == key
        || path
            .strip_prefix(key)
            .is_some_and(|r| r.starts_with(['.', '[']))
}

/// Every key and string value below `table`: (path, is a key, text).
pub(super) fn walk_strings(
    table: &DeTable<'_>,
    prefix: &str,
    out: &mut Vec<(String, bool, String)>,
) {
    for (k, v) in table.iter() {
        let path = join_key(prefix, k.get_ref());
        out.push((path.clone(), true, k.get_ref().to_string()));
        walk_string_value(v.get_ref(), &path, out);
    }
}

pub(super) fn walk_string_value(
    v: &DeValue<'_>,
    path: &str,
    out: &mut Vec<(String, bool, String)>,
) {
    match v {
        DeValue::String(s) => out.push((path.to_string(), false, s.to_string())),
        DeValue::Table(t) => walk_strings(t, path, out),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk_string_value(item.get_ref(), &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

pub(super) fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
