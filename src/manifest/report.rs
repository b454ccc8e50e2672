//! `[report]`: how runs are summarised and, for a `command` study, how its log is read and its
//! FLOPs found; the rules in one place ([`ReportSpec::faults`]: manifest and `--import` alike).

use super::groups::{check_roles, group_collides, is_known_group, Roles};
use serde::{Deserialize, Serialize};

/// `[report]`: how `sweep report` summarises the sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReportSpec {
    /// The run name that speedups are measured against.
    pub baseline: Option<String>,
    /// Log points skipped at the start of every run (warm-up).
    pub skip_first: usize,
    /// Axes to group runs by; all axes when empty.
    pub group_by: Vec<String>,
    /// A regex with named groups (step, loss, tokens_per_second, ...) matching the program's lines.
    pub line_pattern: Option<String>,
    /// The group that is peak memory per device, its unit ending its name (`mem_gb`, `mem_mb`).
    pub memory: Option<String>,
    /// The line_pattern group that is tokens per second per device.
    pub throughput: Option<String>,
    /// The group that is a step's time, its unit ending its name (`time_ms`) or in each figure
    /// (`4.98it/s`): with `tokens_per_step`, tokens/s.
    pub step_time: Option<String>,
    /// Tokens one process trains per step: a number or an expression over the run's values.
    pub tokens_per_step: Option<PerRun>,
    /// Other groups to chart (a bar per configuration).
    pub charts: Vec<String>,
    /// Training FLOPs per token for programs logging none, for TFLOP/s (and with `gpu`, MFU): a
    /// number or an expression over the run's values (a parameter of this name wins).
    pub flops_per_token: Option<PerRun>,
    /// Instead of `flops_per_token`: a built-in preset and the program's sequence length.
    pub model: Option<String>,
    pub sequence_length: Option<usize>,
    /// The device (from the device table) whose dense bf16 peak MFU is measured against.
    pub gpu: Option<String>,
    /// Instead of `gpu`: one process's device peak FLOP/s, a number or an expression.
    pub peak_flops: Option<PerRun>,
}

/// A figure of each run: a number, or an expression planning evaluates into the run's parameter
/// of the key's name (after its id: a report setting is no new measurement).
#[derive(Debug, Clone, PartialEq)]
pub enum PerRun {
    Number(f64),
    Expr(String),
}

impl PerRun {
    /// The number, where it is one.
    pub fn number(&self) -> Option<f64> {
        match self {
            PerRun::Number(n) => Some(*n),
            PerRun::Expr(_) => None,
        }
    }

    /// The expression, where it is one.
    pub fn expr(&self) -> Option<&str> {
        match self {
            PerRun::Expr(e) => Some(e),
            PerRun::Number(_) => None,
        }
    }
}

impl Serialize for PerRun {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PerRun::Number(n) => s.serialize_f64(*n),
            PerRun::Expr(e) => s.serialize_str(e),
        }
    }
}

impl<'de> Deserialize<'de> for PerRun {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PerRun, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = PerRun;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number, or an expression over the run's values (a string)")
            }
            fn visit_f64<E>(self, v: f64) -> Result<PerRun, E> {
                Ok(PerRun::Number(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<PerRun, E> {
                Ok(PerRun::Number(v as f64))
            }
            fn visit_u64<E>(self, v: u64) -> Result<PerRun, E> {
                Ok(PerRun::Number(v as f64))
            }
            fn visit_str<E>(self, v: &str) -> Result<PerRun, E> {
                Ok(PerRun::Expr(v.to_string()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Log points skipped at the start of every run by default (compilation, caches, allocator).
pub const DEFAULT_SKIP_FIRST: usize = 5;

impl ReportSpec {
    /// The figures each run is given: keys and values, in the order computed.
    pub fn per_run(&self) -> Vec<(&'static str, &PerRun)> {
        [
            (super::TOKENS_PER_STEP, &self.tokens_per_step),
            ("flops_per_token", &self.flops_per_token),
            ("peak_flops", &self.peak_flops),
        ]
        .into_iter()
        .filter_map(|(key, f)| Some((key, f.as_ref()?)))
        .collect()
    }

    /// What a per-run figure counts and the most it may be.
    pub fn bounds(key: &str) -> (&'static str, f64) {
        match key {
            "flops_per_token" => ("FLOPs", MAX_FLOPS_PER_TOKEN),
            "peak_flops" => ("FLOP/s", MAX_PEAK_FLOPS),
            _ => ("tokens", MAX_TOKENS_PER_STEP),
        }
    }

    /// Which groups of the line_pattern stand for known fields.
    pub fn roles(&self) -> Roles {
        Roles {
            memory: self.memory.clone(),
            throughput: self.throughput.clone(),
            step_time: self.step_time.clone(),
        }
    }
}

impl Default for ReportSpec {
    fn default() -> Self {
        ReportSpec {
            baseline: None,
            skip_first: DEFAULT_SKIP_FIRST,
            group_by: Vec::new(),
            line_pattern: None,
            memory: None,
            throughput: None,
            step_time: None,
            tokens_per_step: None,
            charts: Vec::new(),
            flops_per_token: None,
            model: None,
            sequence_length: None,
            gpu: None,
            peak_flops: None,
        }
    }
}

/// A `[report]` setting that cannot be: its key, whether its value is at fault, why, and what
/// to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub key: String,
    pub at_value: bool,
    pub why: String,
    pub help: Option<String>,
}

impl Fault {
    fn value(key: impl Into<String>, why: impl Into<String>) -> Self {
        Fault {
            key: key.into(),
            at_value: true,
            why: why.into(),
            help: None,
        }
    }

    fn key(key: impl Into<String>, why: impl Into<String>) -> Self {
        Fault {
            at_value: false,
            ..Fault::value(key, why)
        }
    }

    fn help(self, help: impl Into<String>) -> Self {
        Fault {
            help: Some(help.into()),
            ..self
        }
    }
}

impl ReportSpec {
    /// What is wrong with the settings that read a log and find its FLOPs.
    pub fn faults(&self) -> Vec<Fault> {
        let mut out = self.group_faults();
        out.extend(self.flops_faults());
        out
    }

    /// The line_pattern's other groups become columns: none may be the report's or one of `axes`.
    pub fn collisions(&self, axes: &[&str]) -> Vec<Fault> {
        let Some(re) = self.pattern() else {
            return Vec::new();
        };
        let roles = self.roles();
        re.capture_names()
            .flatten()
            .filter(|g| !is_known_group(g) && !roles.names(g))
            .filter_map(|g| group_collides(g, axes))
            .map(|why| Fault::value("line_pattern", why))
            .collect()
    }

    fn pattern(&self) -> Option<regex::Regex> {
        self.line_pattern
            .as_deref()
            .and_then(|p| crate::util::text::regex(p).ok())
    }

    fn group_faults(&self) -> Vec<Fault> {
        let Some(re) = self.pattern() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let groups: Vec<&str> = re.capture_names().flatten().collect();
        if let Err((key, why)) = check_roles(&re, &self.roles()) {
            out.push(Fault::value(key, why));
        }
        let timed = self.step_time.is_some() || groups.contains(&"step_time_s");
        if let Some(t) = self.tokens_per_step.as_ref().and_then(PerRun::number) {
            if !(t.is_finite() && t > 0.0 && t <= MAX_TOKENS_PER_STEP) {
                out.push(Fault::value(
                    "tokens_per_step",
                    format!("`tokens_per_step` must be a number of tokens above 0 and at most {MAX_TOKENS_PER_STEP:e}, not {t}"),
                ));
            }
        }
        if self.tokens_per_step.is_some() && !timed {
            out.push(Fault::key(
                "tokens_per_step",
                "`tokens_per_step` divides by a step's time, and the line_pattern has none: name its group with `[report] step_time` (e.g. `(?P<time_ms>[\\d.]+)ms` and `step_time = \"time_ms\"`)",
            ));
        }
        for (i, c) in self.charts.iter().enumerate() {
            if !groups.contains(&c.as_str()) || is_known_group(c) {
                let others: Vec<&str> = groups
                    .iter()
                    .filter(|g| !is_known_group(g))
                    .copied()
                    .collect();
                out.push(Fault::value(
                    format!("charts[{i}]"),
                    format!(
                        "`{c}` is no other group of the line_pattern (those it can chart: {})",
                        others.join(", ")
                    ),
                ));
            }
        }
        out
    }

    fn flops_faults(&self) -> Vec<Fault> {
        let mut out = Vec::new();
        if let Some(f) = self.peak_flops.as_ref().and_then(PerRun::number) {
            if !(f.is_finite() && f > 0.0 && f <= MAX_PEAK_FLOPS) {
                out.push(Fault::value(
                    "peak_flops",
                    format!("`peak_flops` must be FLOP/s above 0 and at most {MAX_PEAK_FLOPS:e}, not {f}"),
                ));
            }
        }
        if self.peak_flops.is_some() && self.gpu.is_some() {
            out.push(Fault::key(
                "peak_flops",
                "give `gpu` (a device the table knows) or `peak_flops`, not both",
            ));
        }
        if let Some(f) = self.flops_per_token.as_ref().and_then(PerRun::number) {
            if !(f.is_finite() && f > 0.0 && f <= MAX_FLOPS_PER_TOKEN) {
                out.push(Fault::value(
                    "flops_per_token",
                    format!("`flops_per_token` must be a number of FLOPs above 0 and at most {MAX_FLOPS_PER_TOKEN:e}, not {f}"),
                ));
            }
        }
        if self.flops_per_token.is_some() && self.model.is_some() {
            out.push(Fault::key(
                "model",
                "give `flops_per_token` or `model`, not both",
            ));
        }
        if let Some(m) = &self.model {
            if crate::config::ModelConfig::preset(m).is_none() {
                out.push(
                    Fault::value("model", format!("unknown model preset `{m}`")).help(format!(
                        "the presets are {}",
                        crate::config::PRESETS.join(", ")
                    )),
                );
            }
            if self.sequence_length.is_none() {
                out.push(Fault::key(
                    "model",
                    "`model` needs `sequence_length`: its FLOPs per token depend on it",
                ));
            }
        }
        if let Some(t) = self.sequence_length {
            let most = crate::config::MAX_SEQUENCE_LENGTH;
            if !(1..=most).contains(&t) {
                out.push(Fault::value(
                    "sequence_length",
                    format!("`sequence_length` must be a whole number in 1..={most}, not {t}"),
                ));
            }
        }
        if let Some(g) = &self.gpu {
            if crate::estimate::devices::lookup(g).is_none() {
                out.push(
                    Fault::value(
                        "gpu",
                        format!("the device table does not know `{g}`: MFU needs its peak"),
                    )
                    .help(format!(
                        "known devices: {}",
                        crate::estimate::devices::known()
                    )),
                );
            }
        }
        out
    }
}

/// The largest `peak_flops` taken (FLOP/s of one process's device).
pub const MAX_PEAK_FLOPS: f64 = 1e20;
/// The largest `flops_per_token` taken.
pub const MAX_FLOPS_PER_TOKEN: f64 = 1e18;
/// The most tokens one process may train per step (`tokens_per_step`).
pub const MAX_TOKENS_PER_STEP: f64 = 1e15;
