//! A study's manifest: parsed, checked and turned into a typed [`Manifest`]
//! before anything else happens. Every error names the file, line, column and
//! key path; nothing is written on error.

mod diagnostic;
mod isolate;
mod schema;
mod source;

use crate::util::text::{describe_char, forbidden_char};
pub use diagnostic::{did_you_mean, Diagnostic, Diagnostics};
pub use schema::{
    check_roles, group_collides, memory_unit, parse_slurm_time, Design, EnvironmentSpec,
    ExecutorKind, LocalSpec, PretokenizeStageSpec, ReportSpec, Roles, SlurmSpec, SlurmTime,
    StagesSpec, TemplateChoice, DEFAULT_MAX_RUNS, DEFAULT_SKIP_FIRST, KNOWN_GROUPS, MEMORY_UNITS,
    REPORT_COLUMNS, STAT_SUFFIXES,
};
pub use source::{join_key, Source};

use crate::config::{hints, ModelOverrides, MonitorConfig, PlanHints, TrainConfig};
use crate::template::{describe, Engine};
use schema::ManifestFile;
use serde::de::{DeserializeOwned, IntoDeserializer};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use toml::de::{DeTable, DeValue};
use toml::{Spanned, Value};

/// The most jobs the local executor runs at once.
pub const MAX_PARALLEL: usize = 1024;

/// The parameter that numbers a configuration's repeats (0, 1, …), in runs'
/// parameters and in the templates' context.
pub const REPEAT: &str = "repeat";

/// The names the templates' context gives values of its own (the repeat,
/// the run's id, the study, the run in commands, the job's `[slurm]`): an
/// axis or derived value of that name would be silently replaced.
pub const RESERVED: [&str; 5] = [REPEAT, "id", "study", "run", "slurm"];

/// The most runs `[sweep] max_runs` may allow: beyond, planning alone would
/// need gigabytes.
pub const MAX_MAX_RUNS: u64 = 1_000_000;

/// Either the built-in trainer or any program's command line.
#[derive(Debug, Clone)]
pub enum Mode {
    Train(Box<TrainConfig>),
    Command(String),
}

/// One sweep dimension: a grid axis (one key) or a zip group (several keys
/// whose lists are read together row by row).
#[derive(Debug, Clone)]
pub struct Axis {
    pub keys: Vec<String>,
    /// `rows[i][k]` is the value of `keys[k]` in row `i`.
    pub rows: Vec<Vec<Value>>,
    /// Where each key is written, for errors (`sweep.grid.batch_size`).
    pub paths: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct ExcludeRule {
    pub path: String,
    pub conditions: Vec<(String, Value)>,
}

#[derive(Debug, Clone)]
pub struct Derived {
    pub key: String,
    pub expr: String,
}

#[derive(Debug, Clone)]
pub struct Manifest {
    /// As given on the command line.
    pub path: PathBuf,
    /// The project root: relative paths in the manifest resolve against it.
    pub root: PathBuf,
    pub sha256: String,
    pub source: Source,
    pub name: String,
    pub description: String,
    pub mode: Mode,
    pub executor: Option<ExecutorKind>,
    /// `[defaults]` as written.
    pub defaults: toml::Table,
    pub axes: Vec<Axis>,
    pub exclude: Vec<ExcludeRule>,
    pub derived: Vec<Derived>,
    pub name_template: Option<String>,
    /// The most runs the sweep may expand to.
    pub max_runs: u64,
    /// Runs per configuration (1: no repeats).
    pub repeats: u32,
    /// Repeat k trains with `seed + k`.
    pub seed_per_repeat: bool,
    /// The order runs go out in (`[sweep] design`).
    pub design: Design,
    /// The seed of a blocked design's orders (`[sweep] order_seed`, default 0).
    pub order_seed: u64,
    pub slurm: SlurmSpec,
    pub local: LocalSpec,
    pub stages: StagesSpec,
    pub report: ReportSpec,
    pub environment: EnvironmentSpec,
    /// `[plan]`.
    pub hints: PlanHints,
}

impl Manifest {
    /// Reads and validates a manifest. `root` is the project root (normally the
    /// working directory).
    pub fn load(path: &Path, root: &Path) -> Result<Manifest, Diagnostics> {
        let bytes = std::fs::read(path).map_err(|e| {
            Diagnostic::new(path, format!("cannot read the manifest: {e}"))
                .with_help("give the path of a TOML file, e.g. experiments/quickstart.toml")
        })?;
        let text = String::from_utf8(bytes.clone())
            .map_err(|e| Diagnostic::new(path, format!("the manifest is not UTF-8: {e}")))?;
        Self::parse(path, root, text, crate::util::hash::sha256_bytes(&bytes))
    }

    pub fn parse(
        path: &Path,
        root: &Path,
        text: String,
        sha256: String,
    ) -> Result<Manifest, Diagnostics> {
        let mut source = Source::new(path, text.clone());
        let doc = DeTable::parse(&text).map_err(|e| source.from_toml_error(&e, explain_key))?;
        source.index(doc.get_ref());
        let mut v = Validator {
            source: &source,
            doc: doc.get_ref(),
            errors: Vec::new(),
            engine: Engine::new(),
        };
        // Characters first: a value built to inject a line into a job script
        // is refused as that, whatever else is wrong with it.
        v.check_characters();
        if !v.errors.is_empty() {
            return Err(Diagnostics(v.errors));
        }
        let file = match ManifestFile::deserialize(toml::de::Deserializer::from(doc.clone())) {
            Ok(file) => file,
            Err(e) => {
                v.key_errors(&doc, e, root);
                return Err(Diagnostics(v.errors));
            }
        };
        let manifest = v.validate(file, path, root, sha256.clone());
        if v.errors.is_empty() {
            Ok(manifest.expect("a manifest without errors"))
        } else {
            Err(Diagnostics(v.errors))
        }
    }

    /// Every key that varies across runs, in axis order.
    pub fn axis_keys(&self) -> impl Iterator<Item = &str> {
        self.axes
            .iter()
            .flat_map(|a| a.keys.iter().map(String::as_str))
    }

    /// Where a key is set, for errors found after expansion: the key itself
    /// when the file has it (`slurm.template`), else the axis or derived
    /// value that sets it (also for a section: `architecture` finds
    /// `architecture.n_layers`), else `[defaults]`.
    pub fn locate(&self, key: &str) -> Diagnostic {
        if self.source.has(key) {
            return self.source.at_value(key, "");
        }
        let prefix = format!("{key}.");
        for axis in &self.axes {
            if let Some(i) = axis
                .keys
                .iter()
                .position(|k| k == key || k.starts_with(&prefix))
            {
                return self.source.at_key(&axis.paths[i], "");
            }
        }
        if let Some(d) = self.derived.iter().find(|d| d.key == key) {
            return self.source.at_value(&join_key("sweep.derived", &d.key), "");
        }
        let path = key
            .split('.')
            .fold("defaults".to_string(), |p, k| join_key(&p, k));
        self.source.at_value(&path, "")
    }
}

/// The keys a table of the manifest takes, by its key path, from the types
/// that read it.
fn fields_of(section: &str) -> Option<Vec<String>> {
    use crate::config::{ModelOverrides, MonitorConfig};
    Some(match section {
        "" => known_fields::<ManifestFile>(),
        "sweep" => known_fields::<schema::SweepFile>(),
        "slurm" => known_fields::<SlurmSpec>(),
        "local" => known_fields::<LocalSpec>(),
        "stages" => known_fields::<StagesSpec>(),
        "stages.pretokenize" => known_fields::<PretokenizeStageSpec>(),
        "report" => known_fields::<ReportSpec>(),
        "environment" => known_fields::<EnvironmentSpec>(),
        "plan" => known_fields::<PlanHints>(),
        "defaults" => known_fields::<TrainConfig>(),
        "defaults.architecture" => known_fields::<ModelOverrides>(),
        "defaults.monitor" => known_fields::<MonitorConfig>(),
        _ => return None,
    })
}

/// The values an enum key takes, by its key path, and what they are called.
fn values_of(key: &str) -> Option<(&'static str, Vec<String>)> {
    use crate::config::{
        AttentionKind, DataOrder, DatasetType, DeviceKind, LrSchedule, Precision, Recompute,
    };
    if key == "slurm.template" || key == "stages.pretokenize.template" {
        let names = TemplateChoice::NAMES
            .iter()
            .map(|n| n.to_string())
            .collect();
        return Some(("template", names));
    }
    Some((
        "value",
        match key {
            "executor" => known_variants::<ExecutorKind>(),
            "defaults.dataset_type" => known_variants::<DatasetType>(),
            "defaults.data_order" => known_variants::<DataOrder>(),
            "defaults.precision" => known_variants::<Precision>(),
            "defaults.attention" => known_variants::<AttentionKind>(),
            "defaults.recompute" => known_variants::<Recompute>(),
            "defaults.device" => known_variants::<DeviceKind>(),
            "defaults.lr_schedule" => known_variants::<LrSchedule>(),
            _ => return None,
        },
    ))
}

/// Where a TOML error's key is not a key of its table, or its value not one
/// of its enum's: the message and a did-you-mean, from the types' own lists
/// (never from the text of serde's message).
fn explain_key(source: &Source, key: &str) -> Option<(String, String)> {
    let section = source::parent_path(key).unwrap_or("");
    let word = source::last_segment(key);
    let help = |word: &str, expected: &[String]| match did_you_mean(
        word,
        expected.iter().map(String::as_str),
    ) {
        Some(s) => format!("did you mean `{s}`?"),
        None if expected.is_empty() => "this table takes no keys".to_string(),
        None => format!("expected one of: {}", expected.join(", ")),
    };
    if let Some(fields) = fields_of(section) {
        if !fields.iter().any(|f| f == word) {
            let at = if section.is_empty() {
                String::new()
            } else {
                format!(" in [{section}]")
            };
            return Some((format!("unknown key `{word}`{at}"), help(word, &fields)));
        }
    }
    let (noun, values) = values_of(key)?;
    let value = source.string_value(key)?;
    (!values.iter().any(|v| v == value))
        .then(|| (format!("unknown {noun} `{value}`"), help(value, &values)))
}

/// The field names of a struct, from its own `Deserialize` implementation
/// (serde's derive hands them to `deserialize_struct`), so the list never
/// drifts from the type.
pub fn known_fields<T: DeserializeOwned>() -> Vec<String> {
    probed_names::<T>()
}

/// The variant names of an enum (as manifests spell them), from its own
/// `Deserialize` implementation, as [`known_fields`] does for structs.
pub fn known_variants<T: DeserializeOwned>() -> Vec<String> {
    probed_names::<T>()
}

/// The names a type's `Deserialize` asks for: its fields or its variants.
fn probed_names<T: DeserializeOwned>() -> Vec<String> {
    let mut probe = FieldsProbe(None);
    let _ = T::deserialize(&mut probe);
    probe
        .0
        .unwrap_or_default()
        .iter()
        .map(|f| f.to_string())
        .collect()
}

/// A deserializer that records the field (or variant) list it is asked for
/// and gives nothing.
struct FieldsProbe(Option<&'static [&'static str]>);

impl<'de> serde::Deserializer<'de> for &mut FieldsProbe {
    type Error = serde::de::value::Error;

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = Some(fields);
        Err(serde::de::Error::custom("probed"))
    }

    fn deserialize_enum<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = Some(variants);
        Err(serde::de::Error::custom("probed"))
    }

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::custom("not a struct"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
        identifier ignored_any
    }
}

struct Validator<'a, 'i> {
    source: &'a Source,
    doc: &'a DeTable<'i>,
    errors: Vec<Diagnostic>,
    engine: Engine,
}

impl Validator<'_, '_> {
    fn err(&mut self, d: Diagnostic) {
        self.errors.push(d);
    }

    fn at_key(&mut self, path: &str, msg: impl Into<String>) {
        let d = self.source.at_key(path, msg);
        self.err(d);
    }

    fn at_value(&mut self, path: &str, msg: impl Into<String>) {
        let d = self.source.at_value(path, msg);
        self.err(d);
    }

    fn at_value_help(&mut self, path: &str, msg: impl Into<String>, help: impl Into<String>) {
        let d = self.source.at_value(path, msg).with_help(help);
        self.err(d);
    }

    /// Every key the file's structure refuses (each misspelt key, each
    /// wrong type), found alone; when only keys inside sections fail, the
    /// rest is validated too, so one round shows every independent error.
    /// `first` is serde's error for the whole document: what is said when no
    /// key fails alone (a missing key).
    fn key_errors(&mut self, doc: &Spanned<DeTable<'_>>, first: toml::de::Error, root: &Path) {
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
        // A wrong top-level key (`comand`, `[sweeep]`) changes what every
        // other check would mean: stop there rather than report its echoes.
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

    fn spanned_table(&self, key: &str) -> Option<Spanned<DeTable<'_>>> {
        self.doc.get(key).and_then(|v| match v.get_ref() {
            DeValue::Table(t) => Some(Spanned::new(v.span(), t.clone())),
            _ => None,
        })
    }

    /// Whether a dotted key is written in a top-level table of the file.
    fn written(&self, table: &str, dotted: &str) -> bool {
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
    fn mode(&mut self, command: &Option<String>) -> Mode {
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

    /// `[report]`'s keys for foreign logs: roles and charts name groups of
    /// the line_pattern, and what computes FLOPs is a number, a preset and a
    /// device the tables know. The built-in trainer logs all of it itself.
    /// `[environment]`: a system name a history can group by (one line of
    /// printable text), and probes with plain names and a command each.
    fn check_environment(&mut self, e: &EnvironmentSpec) {
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

    /// Each foreign group of the line pattern makes columns of its own: none
    /// may be the report's or an axis's ([`group_collides`]).
    fn check_pattern_groups(&mut self, r: &ReportSpec, axes: &[Axis]) {
        let Some(re) = r
            .line_pattern
            .as_deref()
            .and_then(|p| crate::util::text::regex(p).ok())
        else {
            return;
        };
        let keys: Vec<&str> = axes
            .iter()
            .flat_map(|a| a.keys.iter().map(String::as_str))
            .collect();
        let roles = r.roles();
        for g in re.capture_names().flatten() {
            let role = roles.memory.as_deref() == Some(g) || roles.throughput.as_deref() == Some(g);
            if KNOWN_GROUPS.contains(&g) || role {
                continue;
            }
            if let Some(why) = group_collides(g, &keys) {
                self.at_value("report.line_pattern", why);
            }
        }
    }

    fn check_report(&mut self, r: &ReportSpec, command: bool) {
        let foreign = [
            ("memory", r.memory.is_some()),
            ("throughput", r.throughput.is_some()),
            ("charts", !r.charts.is_empty()),
            ("flops_per_token", r.flops_per_token.is_some()),
            ("model", r.model.is_some()),
            ("sequence_length", r.sequence_length.is_some()),
            ("gpu", r.gpu.is_some()),
        ];
        for (key, set) in foreign {
            let needs_pattern = matches!(key, "memory" | "throughput" | "charts");
            if set && (!command || (needs_pattern && r.line_pattern.is_none())) {
                let why = match command {
                    false => "the built-in trainer logs its memory, throughput and FLOPs itself: it is for `command` sweeps",
                    true => "it names a group of `[report] line_pattern`, which is not set",
                };
                self.at_key(&format!("report.{key}"), format!("`{key}`: {why}"));
            }
        }
        // An invalid pattern is reported above.
        if let Some(re) = r
            .line_pattern
            .as_deref()
            .and_then(|p| crate::util::text::regex(p).ok())
        {
            let groups: Vec<&str> = re.capture_names().flatten().collect();
            if let Err((key, why)) = check_roles(&groups, &r.roles()) {
                self.at_value(&format!("report.{key}"), why);
            }
            for (i, c) in r.charts.iter().enumerate() {
                if !groups.contains(&c.as_str()) || KNOWN_GROUPS.contains(&c.as_str()) {
                    self.at_value(
                        &format!("report.charts[{i}]"),
                        format!(
                            "`{c}` is no other group of the line_pattern (those it can chart: {})",
                            groups
                                .iter()
                                .filter(|g| !KNOWN_GROUPS.contains(g))
                                .copied()
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                }
            }
        }
        if let Some(f) = r.flops_per_token {
            if !(f.is_finite() && f > 0.0 && f <= 1e18) {
                self.at_value(
                    "report.flops_per_token",
                    format!("`flops_per_token` must be a number of FLOPs above 0 and at most 1e18, not {f}"),
                );
            }
            if r.model.is_some() {
                self.at_key(
                    "report.model",
                    "give `flops_per_token` or `model`, not both",
                );
            }
        }
        if let Some(m) = &r.model {
            if crate::config::ModelConfig::preset(m).is_none() {
                self.at_value_help(
                    "report.model",
                    format!("unknown model preset `{m}`"),
                    format!("the presets are {}", crate::config::PRESETS.join(", ")),
                );
            }
            if r.sequence_length.is_none() {
                self.at_key(
                    "report.model",
                    "`model` needs `sequence_length`: its FLOPs per token depend on it",
                );
            }
        }
        if let Some(t) = r.sequence_length {
            if !(1..=crate::config::MAX_SEQUENCE_LENGTH).contains(&t) {
                self.at_value(
                    "report.sequence_length",
                    format!(
                        "`sequence_length` must be a whole number in 1..={}, not {t}",
                        crate::config::MAX_SEQUENCE_LENGTH
                    ),
                );
            }
        }
        if let Some(g) = &r.gpu {
            if crate::estimate::devices::lookup(g).is_none() {
                self.at_value_help(
                    "report.gpu",
                    format!("the device table does not know `{g}`: MFU needs its peak"),
                    format!("known devices: {}", crate::estimate::devices::known()),
                );
            }
        }
    }

    /// `max_runs` and `repeats`, or None (with the error) where they are out
    /// of bounds.
    fn runs_and_repeats(
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

    /// The bounded counts of the other sections, the log pattern, sbatch
    /// options and environment names.
    fn check_sections(&mut self, file: &ManifestFile) {
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
            if !line.trim_start().starts_with('-') {
                self.at_value_help(
                    &format!("slurm.extra_sbatch[{i}]"),
                    format!("`{line}` is not an sbatch option"),
                    "each entry is written as `#SBATCH <entry>`: give options such as `--exclusive` or `--gres=gpu:4`",
                );
            }
        }
        for (k, _) in &file.slurm.env {
            if !is_env_name(k) {
                self.at_key(
                    &join_key("slurm.env", k),
                    format!("`{k}` is not a valid environment variable name"),
                );
            }
        }
    }

    fn validate(
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
            max_runs,
            repeats,
            seed_per_repeat: file.sweep.seed_per_repeat,
            design: file.sweep.design.unwrap_or_default(),
            order_seed: file.sweep.order_seed.unwrap_or(0),
            slurm: file.slurm,
            local: file.local,
            stages: file.stages,
            report: file.report,
            environment: file.environment,
            hints,
        })
    }

    /// `[plan]`, validated; a hint key in `[defaults]` is an error (it
    /// changes no run: `[plan]` holds it).
    fn hints(&mut self, defaults: &toml::Table, plan: &PlanHints) -> PlanHints {
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

    /// Every key and string value of the file against [`forbidden_char`]:
    /// values reach `#SBATCH` lines and shell lines of job scripts, where a
    /// line break starts a directive or command of its own whatever the quoting.
    fn check_characters(&mut self) {
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

    /// Counts the runs from the axis lengths (saturating: the count of a huge
    /// grid does not fit any integer) and refuses more than `max_runs`.
    fn check_size(&mut self, axes: &[Axis], max_runs: u64, repeats: u32) -> bool {
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

    fn check_name(&mut self, name: &str) {
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
    fn train_defaults(&mut self) -> TrainConfig {
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

    fn axes(&mut self, grid: &toml::Table, zip: &[toml::Table]) -> Vec<Axis> {
        let mut axes = Vec::new();
        for (key, path, value) in flatten(grid, "", "sweep.grid") {
            if let Some(values) = self.axis_values(&key, &path, &value, true) {
                axes.push(Axis {
                    keys: vec![key],
                    rows: values.into_iter().map(|v| vec![v]).collect(),
                    paths: vec![path],
                });
            }
        }
        for (g, group) in zip.iter().enumerate() {
            let group_path = format!("sweep.zip[{g}]");
            let entries = flatten(group, "", &group_path);
            if entries.is_empty() {
                self.at_key(&group_path, "this zip group has no axes");
                continue;
            }
            let mut columns = Vec::new();
            for (key, path, value) in entries {
                if let Some(values) = self.axis_values(&key, &path, &value, false) {
                    columns.push((key, path, values));
                }
            }
            let lens: Vec<usize> = columns.iter().map(|c| c.2.len()).collect();
            if lens.windows(2).any(|w| w[0] != w[1]) {
                let detail = columns
                    .iter()
                    .map(|(k, _, v)| format!("`{k}` has {}", v.len()))
                    .collect::<Vec<_>>()
                    .join(", ");
                let d = self
                    .source
                    .at_key(&columns[1].1, format!("zipped lists must have equal lengths: {detail}"))
                    .with_help("zip pairs the i-th values of every list; use [sweep.grid] for all combinations");
                self.err(d);
                continue;
            }
            if columns.is_empty() {
                continue;
            }
            let n = lens[0];
            let rows: Vec<Vec<Value>> = (0..n)
                .map(|i| columns.iter().map(|c| c.2[i].clone()).collect())
                .collect();
            let mut seen = std::collections::HashSet::with_capacity(n);
            let key = |row: &[Value]| {
                row.iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join("\u{1f}")
            };
            if let Some(i) = (0..n).find(|&i| !seen.insert(key(&rows[i]))) {
                let p = format!("{}[{i}]", columns[0].1);
                self.at_value(
                    &p,
                    format!("row {i} of this zip group repeats an earlier row"),
                );
                continue;
            }
            axes.push(Axis {
                keys: columns.iter().map(|c| c.0.clone()).collect(),
                paths: columns.iter().map(|c| c.1.clone()).collect(),
                rows,
            });
        }
        // One key, one axis.
        let mut seen: Vec<(String, String)> = Vec::new();
        for axis in &axes {
            for (k, p) in axis.keys.iter().zip(&axis.paths) {
                if let Some((_, first)) = seen.iter().find(|(s, _)| s == k) {
                    let msg = format!("`{k}` is swept twice (also at `{first}`)");
                    self.at_key(p, msg);
                } else {
                    seen.push((k.clone(), p.clone()));
                }
            }
        }
        axes
    }

    /// The values of one axis; `unique` for grid axes (a zip column may repeat values).
    fn axis_values(
        &mut self,
        key: &str,
        path: &str,
        value: &Value,
        unique: bool,
    ) -> Option<Vec<Value>> {
        let Value::Array(values) = value else {
            self.at_value_help(
                path,
                format!("axis `{key}` must be a list of values"),
                format!("write `{key} = [{value}]`, or set it in [defaults] if it does not vary"),
            );
            return None;
        };
        if values.is_empty() {
            self.at_value(path, format!("axis `{key}` has no values"));
            return None;
        }
        let mut ok = true;
        let mut seen = std::collections::HashSet::with_capacity(values.len());
        for (i, v) in values.iter().enumerate() {
            let p = format!("{path}[{i}]");
            match v {
                Value::String(_) | Value::Integer(_) | Value::Float(_) | Value::Boolean(_) => {
                    if unique && !seen.insert(v.to_string()) {
                        self.at_value(&p, format!("axis `{key}` lists {v} twice"));
                        ok = false;
                    }
                }
                _ => {
                    self.at_value(
                        &p,
                        format!(
                            "axis values must be strings, numbers or booleans, not {}",
                            v.type_str()
                        ),
                    );
                    ok = false;
                }
            }
        }
        ok.then(|| values.clone())
    }

    fn check_axis_key(&mut self, mode: &Mode, key: &str, path: &str, axis: &Axis) {
        if RESERVED.contains(&key) {
            self.at_key_help(
                path,
                format!("`{key}` is a reserved name: the templates give it a value of their own"),
                format!(
                    "name the axis otherwise; reserved: {} (`[sweep] repeats` numbers repeats)",
                    RESERVED.join(", ")
                ),
            );
            return;
        }
        let col = axis.keys.iter().position(|k| k == key).unwrap();
        let (head, rest) = match key.split_once('.') {
            Some((h, r)) => (h, Some(r)),
            None => (key, None),
        };
        if head == "slurm" {
            let Some(field) = rest else {
                self.at_key(path, "sweep `slurm.<key>`, not the whole [slurm] table");
                return;
            };
            if field == "pack" {
                self.at_key_help(
                    path,
                    "`slurm.pack` is one choice for the whole study, not an axis",
                    "set `pack = true` in [slurm]: every block of the blocked design becomes one job",
                );
                return;
            }
            if self.written("slurm", field) {
                self.at_key_help(
                    path,
                    format!("`{key}` is set both in [slurm] and as an axis"),
                    "remove one of the two",
                );
                return;
            }
            self.type_check::<SlurmSpec>(
                key,
                field,
                path,
                axis,
                col,
                &known_fields::<SlurmSpec>(),
                None,
            );
            return;
        }
        if hints::KEYS.contains(&key) {
            self.at_key_help(
                path,
                format!("`{key}` is a hint for `sweep plan`: it changes no run, so sweeping it would make runs that are one and the same"),
                "set it once, in [plan]",
            );
            return;
        }
        if self.written("defaults", key) {
            self.at_key_help(
                path,
                format!("`{key}` is set both in [defaults] and as an axis"),
                "an axis gives the values itself: remove the key from [defaults]",
            );
            return;
        }
        if let Mode::Train(_) = mode {
            let (fields, sub, nested): (Vec<String>, &str, Option<&str>) = match (head, rest) {
                ("architecture", Some(r)) => {
                    (known_fields::<ModelOverrides>(), r, Some("architecture"))
                }
                ("monitor", Some(r)) => (known_fields::<MonitorConfig>(), r, Some("monitor")),
                _ => (known_fields::<TrainConfig>(), key, None),
            };
            self.type_check::<TrainConfig>(key, sub, path, axis, col, &fields, nested);
        }
    }

    fn at_key_help(&mut self, path: &str, msg: impl Into<String>, help: impl Into<String>) {
        let d = self.source.at_key(path, msg).with_help(help);
        self.err(d);
    }

    /// Checks that `field` exists on `T` and that every value of the axis has
    /// the right type, by deserialising a one-key table per value.
    #[allow(clippy::too_many_arguments)]
    fn type_check<T: DeserializeOwned>(
        &mut self,
        key: &str,
        field: &str,
        path: &str,
        axis: &Axis,
        col: usize,
        fields: &[String],
        nested: Option<&str>,
    ) {
        if !fields.iter().any(|f| f == field) {
            let help = match did_you_mean(field, fields.iter().map(String::as_str)) {
                Some(s) => format!("did you mean `{}`?", key.replace(field, s)),
                None => format!("known keys: {}", fields.join(", ")),
            };
            self.at_key_help(path, format!("unknown key `{key}`"), help);
            return;
        }
        for (i, row) in axis.rows.iter().enumerate() {
            let mut inner = toml::Table::new();
            inner.insert(field.to_string(), row[col].clone());
            let table = match nested {
                Some(n) => {
                    let mut t = toml::Table::new();
                    t.insert(n.to_string(), Value::Table(inner));
                    t
                }
                None => inner,
            };
            if let Err(e) = T::deserialize(Value::Table(table)) {
                self.at_value(
                    &format!("{path}[{i}]"),
                    format!(
                        "bad value for `{key}`: {}",
                        source::plain_types(e.message().trim())
                    ),
                );
            }
        }
    }

    fn exclude(&mut self, rules: &[toml::Table], axes: &[Axis]) -> Vec<ExcludeRule> {
        let mut out = Vec::new();
        for (r, rule) in rules.iter().enumerate() {
            let path = format!("sweep.exclude[{r}]");
            let conds = flatten(rule, "", &path);
            if conds.is_empty() {
                self.at_key(&path, "an exclude rule needs at least one `key = value`");
                continue;
            }
            let mut conditions = Vec::new();
            for (key, p, value) in conds {
                let axis = axes.iter().find(|a| a.keys.contains(&key));
                match axis {
                    None => {
                        let keys: Vec<&str> = axes
                            .iter()
                            .flat_map(|a| a.keys.iter().map(String::as_str))
                            .collect();
                        let help = match did_you_mean(&key, keys.iter().copied()) {
                            Some(s) => format!("did you mean `{s}`?"),
                            None => format!(
                                "exclude rules name axes; the axes are: {}",
                                keys.join(", ")
                            ),
                        };
                        self.at_key_help(&p, format!("`{key}` is not an axis"), help);
                    }
                    Some(a) => {
                        let col = a.keys.iter().position(|k| *k == key).unwrap();
                        if !a.rows.iter().any(|row| row[col] == value) {
                            self.at_value(&p, format!("`{key} = {value}` matches no value of the axis, so this rule excludes nothing"));
                        } else {
                            conditions.push((key, value));
                        }
                    }
                }
            }
            out.push(ExcludeRule { path, conditions });
        }
        out
    }

    fn derived(
        &mut self,
        table: &toml::Table,
        axes: &[Axis],
        defaults: &toml::Table,
    ) -> Vec<Derived> {
        let mut out = Vec::new();
        for (key, value) in table {
            let path = join_key("sweep.derived", key);
            let Value::String(expr) = value else {
                self.at_value_help(
                    &path,
                    format!("derived value `{key}` must be a string holding an expression"),
                    "e.g. `global_batch_size = \"batch_size * slurm.nodes * slurm.gpus_per_node\"`",
                );
                continue;
            };
            if RESERVED.contains(&key.as_str()) {
                self.at_key(
                    &path,
                    format!(
                        "`{key}` is a reserved name: the templates give it a value of their own (reserved: {})",
                        RESERVED.join(", ")
                    ),
                );
                continue;
            }
            if axes.iter().any(|a| a.keys.contains(key)) {
                self.at_key(
                    &path,
                    format!("`{key}` is both an axis and a derived value"),
                );
                continue;
            }
            if defaults.contains_key(key) {
                self.at_key(
                    &path,
                    format!("`{key}` is both in [defaults] and a derived value"),
                );
                continue;
            }
            if let Err(e) = self.engine.check(expr) {
                self.at_value(
                    &path,
                    format!("derived value `{key}` does not compile: {}", describe(&e)),
                );
                continue;
            }
            out.push(Derived {
                key: key.clone(),
                expr: expr.clone(),
            });
        }
        out
    }
}

/// Flattens nested tables into dotted keys: `{slurm = {nodes = [..]}}` and
/// `"slurm.nodes" = [..]` both give `slurm.nodes`. Returns (key, path, value).
fn flatten(table: &toml::Table, prefix: &str, path: &str) -> Vec<(String, String, Value)> {
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

/// The values that may span lines: the command template (passed to `bash -c`
/// as one quoted word), the description, and the run-name and derived-value
/// templates (what they produce is checked per run).
const MULTILINE_KEYS: &[&str] = &["command", "description", "sweep.name", "sweep.derived"];

/// Whether `path` is `key` or lies below it.
fn key_under(path: &str, key: &str) -> bool {
    path == key
        || path
            .strip_prefix(key)
            .is_some_and(|r| r.starts_with(['.', '[']))
}

/// Every key and string value below `table`: (path, is a key, text).
fn walk_strings(table: &DeTable<'_>, prefix: &str, out: &mut Vec<(String, bool, String)>) {
    for (k, v) in table.iter() {
        let path = join_key(prefix, k.get_ref());
        out.push((path.clone(), true, k.get_ref().to_string()));
        walk_string_value(v.get_ref(), &path, out);
    }
}

fn walk_string_value(v: &DeValue<'_>, path: &str, out: &mut Vec<(String, bool, String)>) {
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

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Manifest, Diagnostics> {
        Manifest::parse(
            Path::new("m.toml"),
            Path::new("/p"),
            text.to_string(),
            "0".into(),
        )
    }

    #[test]
    fn known_fields_reads_the_struct() {
        let f = known_fields::<SlurmSpec>();
        assert!(f.contains(&"partition".to_string()) && f.contains(&"gpus_per_node".to_string()));
        assert!(known_fields::<TrainConfig>().contains(&"batch_size".to_string()));
    }

    #[test]
    fn a_valid_manifest_loads() {
        let m = parse(
            r#"
name = "s"
[defaults]
dataset = "d.parquet"
[sweep.grid]
batch_size = [1, 2]
slurm.nodes = [1, 2]
[[sweep.zip]]
learning_rate = [1e-4, 2e-4]
warmup_steps = [10, 20]
[sweep.derived]
gbs = "batch_size * slurm.nodes"
"#,
        )
        .unwrap();
        assert_eq!(m.axes.len(), 3);
        assert_eq!(m.axes[1].keys, vec!["slurm.nodes"]);
        assert_eq!(m.axes[2].rows.len(), 2);
        assert_eq!(m.derived[0].key, "gbs");
    }

    #[test]
    fn unknown_key_names_line_column_and_suggestion() {
        let e = parse("name = \"s\"\n[slurm]\npartiton = \"x\"\n").unwrap_err();
        let d = &e.0[0];
        assert_eq!((d.line, d.column), (3, 1), "{d}");
        assert_eq!(d.key.as_deref(), Some("slurm.partiton"));
        assert_eq!(d.help.as_deref(), Some("did you mean `partition`?"));
    }
}
