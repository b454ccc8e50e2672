//! A study's manifest: parsed, checked and turned into a typed [`Manifest`]
//! before anything else happens. Every error names the file, line, column and
//! key path; nothing is written on error.

mod axes;
mod diagnostic;
mod groups;
mod isolate;
mod keys;
mod report;
mod schema;
pub mod slurm_options;
mod source;
mod validate;
mod watchdog;

pub use keys::known_fields;
use keys::*;
use validate::*;

use crate::util::fs::read_regular;
use crate::util::text::{describe_char, forbidden_char};
pub use diagnostic::{did_you_mean, Diagnostic, Diagnostics};
pub use groups::{
    check_roles, group_collides, is_known_group, memory_unit, step_unit, Field, Roles, StepUnit,
    REPORT_COLUMNS, STAT_SUFFIXES, TIME_UNITS,
};
pub use report::{
    Fault, PerRun, ReportSpec, DEFAULT_SKIP_FIRST, MAX_FLOPS_PER_TOKEN, MAX_PEAK_FLOPS,
    MAX_TOKENS_PER_STEP,
};
pub use schema::{
    parse_slurm_time, Design, EnvironmentSpec, ExecutorKind, Launcher, LocalSpec,
    PretokenizeStageSpec, SlurmSpec, SlurmTime, StagesSpec, TemplateChoice, DEFAULT_MAX_RUNS,
    SIGNAL_GRACE,
};
pub use slurm_options::{check as check_owned_options, RANK_VARIABLES};
pub use source::{join_key, ManifestText};
pub use watchdog::{parse_watch_duration, Stall, WatchdogSpec};

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

/// The parameter a command run's `[report] tokens_per_step` is stored in,
/// for the report to divide by each step's time.
pub const TOKENS_PER_STEP: &str = "tokens_per_step";

/// The names the templates' context gives values of its own (the repeat,
/// the run's id, the study, the run in commands, the job's `[slurm]`): an
/// axis or derived value of that name would be silently replaced.
pub const RESERVED: [&str; 5] = [REPEAT, "id", "study", "run", "slurm"];

/// The most runs `[sweep] max_runs` may allow: beyond, planning alone would
/// need gigabytes.
pub const MAX_MAX_RUNS: u64 = 1_000_000;

/// The largest manifest read: a million-row zip fits in a few tens of MB.
const MAX_MANIFEST_BYTES: u64 = 64 << 20;

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
    pub source: ManifestText,
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
    /// `[watchdog]`.
    pub watchdog: WatchdogSpec,
    /// `[plan]`.
    pub hints: PlanHints,
}

impl Manifest {
    /// Reads and validates a manifest. `root` is the project root (normally the
    /// working directory).
    pub fn load(path: &Path, root: &Path) -> Result<Manifest, Diagnostics> {
        let bytes = read_regular(path, MAX_MANIFEST_BYTES, None).map_err(|e| {
            Diagnostic::new(path, format!("cannot read the manifest: it {e}"))
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
        let mut source = ManifestText::new(path, text.clone());
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
