//! A line pattern's named groups: those meaning a field the report knows, the columns no other
//! group may make, and what `[report]`'s roles make of the groups they name, with their units.

/// A field the report knows: a `metrics.jsonl` key and a `line_pattern` group name; every other
/// group is a field of its own. Adding one: docs/extending.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray)]
pub enum Field {
    // Summarised per run, in the summary's order (see [`Field::shown`]).
    TokensPerSecond,
    MfuPct,
    Tflops,
    TrainingTokensPct,
    PeakMemoryMb,
    JoulesPerToken,
    Watts,
    Loss,
    StepTimeS,
    ElapsedS,
    GlobalTokensPerSecond,
    WorldSize,
    BatchSize,
}

impl Field {
    pub const fn name(self) -> &'static str {
        match self {
            Field::TokensPerSecond => "tokens_per_second",
            Field::MfuPct => "mfu_pct",
            Field::Tflops => "tflops",
            Field::TrainingTokensPct => "training_tokens_pct",
            Field::PeakMemoryMb => "peak_memory_mb",
            Field::JoulesPerToken => "joules_per_token",
            Field::Watts => "watts",
            Field::Loss => "loss",
            Field::StepTimeS => "step_time_s",
            Field::ElapsedS => "elapsed_s",
            Field::GlobalTokensPerSecond => "global_tokens_per_second",
            Field::WorldSize => "world_size",
            Field::BatchSize => "batch_size",
        }
    }

    pub fn named(name: &str) -> Option<Field> {
        use strum::VariantArray;
        Field::VARIANTS.iter().copied().find(|f| f.name() == name)
    }

    /// What a run can log: finite, far beyond any real device but below what only a corrupt or
    /// hostile log holds; values outside are left out and reported.
    pub fn plausible(self) -> std::ops::RangeInclusive<f64> {
        match self {
            Field::Loss => 0.0..=1e6,
            Field::TokensPerSecond | Field::GlobalTokensPerSecond => 0.0..=1e12,
            Field::TrainingTokensPct => 0.0..=100.0 + 1e-9,
            Field::MfuPct => 0.0..=1e5,
            Field::Tflops => 0.0..=1e9,
            Field::StepTimeS | Field::ElapsedS => 0.0..=3.2e9,
            Field::WorldSize => 1.0..=1e8,
            Field::BatchSize => 0.0..=1e9,
            // An exabyte.
            Field::PeakMemoryMb => 0.0..=1e12,
            // A megawatt a device; a megajoule a token.
            Field::Watts | Field::JoulesPerToken => 0.0..=1e6,
        }
    }

    /// The summary's heading and decimals of a field it summarises per run.
    pub fn shown(self) -> Option<(&'static str, usize)> {
        Some(match self {
            Field::TokensPerSecond => ("Tokens/sec", 2),
            Field::MfuPct => ("MFU %", 2),
            Field::Tflops => ("TFLOPs", 2),
            Field::TrainingTokensPct => ("Training tokens %", 2),
            Field::PeakMemoryMb => ("Peak memory (MB)", 0),
            Field::JoulesPerToken => ("Joules/token", 4),
            Field::Watts => ("Watts", 0),
            _ => return None,
        })
    }

    /// The fields the summary summarises, in its order.
    pub fn summarised() -> impl Iterator<Item = Field> {
        use strum::VariantArray;
        Field::VARIANTS
            .iter()
            .copied()
            .filter(|f| f.shown().is_some())
    }
}

/// Whether a `line_pattern`'s group means a field the report knows.
pub fn is_known_group(group: &str) -> bool {
    group == "step" || Field::named(group).is_some()
}

/// The report's own columns besides the fields' statistics (a test checks the list is whole).
pub const REPORT_COLUMNS: [&str; 27] = [
    "run",
    "log_index",
    "order",
    "state",
    "runs",
    "points",
    "final_loss",
    "wall_time_s",
    "last_step",
    "speedup",
    "speedup_ci95_low",
    "speedup_ci95_high",
    "speedup_p_value",
    "speedup_p_value_holm",
    "significant",
    "repeats",
    "warmup_points",
    "scaling_efficiency_pct",
    "forecast_efficiency_pct",
    "mfu_peak_tflops",
    "trained_batch_size",
    "members",
    "first_steady",
    "configuration",
    "configuration_name",
    "_job_run_s",
    "_forecast_vs_one_device",
];

/// The suffixes of a measure's statistic columns (`mem_gb_mean`, ..., `mem_gb_ci95_high`).
pub const STAT_SUFFIXES: [&str; 7] = [
    "_mean",
    "_median",
    "_std",
    "_p5",
    "_p95",
    "_ci95_low",
    "_ci95_high",
];

/// Why a foreign group cannot have columns of its own: one would be the report's or an axis's.
pub fn group_collides(group: &str, axes: &[&str]) -> Option<String> {
    let made = std::iter::once(group.to_string())
        .chain(STAT_SUFFIXES.iter().map(|s| format!("{group}{s}")));
    for col in made {
        let known = STAT_SUFFIXES
            .iter()
            .any(|s| col.strip_suffix(s).is_some_and(is_known_group));
        if REPORT_COLUMNS.contains(&col.as_str()) || known {
            return Some(format!(
                "the group `{group}` would make a column `{col}`, which the report makes itself: name the group otherwise"
            ));
        }
        if let Some(a) = axes
            .iter()
            .find(|a| **a == col || a.rsplit('.').next() == Some(col.as_str()))
        {
            return Some(format!(
                "the group `{group}` would make a column `{col}`, the axis `{a}`'s: name the group otherwise"
            ));
        }
    }
    None
}

/// Which foreign groups stand for known fields.
#[derive(Debug, Clone, Default)]
pub struct Roles {
    /// The group that is the peak memory per device.
    pub memory: Option<String>,
    /// The group that is tokens per second per device.
    pub throughput: Option<String>,
    /// The group that is a step's time (its unit in its name or each figure).
    pub step_time: Option<String>,
}

impl Roles {
    /// Whether `group` stands for a known field.
    pub fn names(&self, group: &str) -> bool {
        [&self.memory, &self.throughput, &self.step_time]
            .iter()
            .any(|r| r.as_deref() == Some(group))
    }
}

/// Units a step-time group's name may end in, and seconds per unit.
pub const TIME_UNITS: [(&str, f64); 6] = [
    ("_ns", 1e-9),
    ("_us", 1e-6),
    ("_ms", 1e-3),
    ("_s", 1.0),
    ("_sec", 1.0),
    ("_min", 60.0),
];

/// Rate suffixes of a step-time group (steps per unit) and seconds per unit.
pub const RATE_UNITS: [(&str, f64); 3] = [("_per_s", 1.0), ("_per_sec", 1.0), ("_per_min", 60.0)];

/// How a step-time group's figures become seconds per step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepUnit {
    /// Seconds per unit of the figure: the name ends in a time (`time_ms`).
    Time(f64),
    /// Steps per this many seconds (`it_per_s`, `train_steps_per_second`).
    Rate(f64),
    /// Each figure says its own unit (`5.33ms`, `4.98it/s`).
    InFigure,
}

/// A step-time group's unit, from its name's end (a rate first: `it_per_s` ends in `_s`).
pub fn step_unit(group: &str) -> StepUnit {
    match unit_of(group, &RATE_UNITS) {
        Some(s) => StepUnit::Rate(s),
        None => unit_of(group, &TIME_UNITS).map_or(StepUnit::InFigure, StepUnit::Time),
    }
}

/// The factor of the unit (of `units`) a group's name ends in.
fn unit_of(group: &str, units: &[(&str, f64)]) -> Option<f64> {
    let lower = group.to_ascii_lowercase();
    units
        .iter()
        .find(|(suffix, _)| lower.ends_with(suffix))
        .map(|&(_, factor)| factor)
}

/// Memory group suffixes and MB (2^20 bytes) per unit: SI decimal, IEC binary.
pub const MEMORY_UNITS: [(&str, f64); 8] = [
    ("_bytes", 1.0 / 1048576.0),
    ("_kb", 1e3 / 1048576.0),
    ("_kib", 1.0 / 1024.0),
    ("_mb", 1e6 / 1048576.0),
    ("_mib", 1.0),
    ("_gb", 1e9 / 1048576.0),
    ("_gib", 1024.0),
    ("_tb", 1e12 / 1048576.0),
];

/// MB per unit of a memory group, from the unit its name ends in.
pub fn memory_unit(group: &str) -> Option<f64> {
    unit_of(group, &MEMORY_UNITS)
}

/// Why `roles` do not fit a line pattern's groups, with the role's key.
pub fn check_roles(re: &regex::Regex, roles: &Roles) -> Result<(), (&'static str, String)> {
    let groups: Vec<&str> = re.capture_names().flatten().collect();
    for (key, group) in [
        ("memory", &roles.memory),
        ("throughput", &roles.throughput),
        ("step_time", &roles.step_time),
    ] {
        let Some(g) = group else { continue };
        if !groups.contains(&g.as_str()) {
            return Err((
                key,
                format!(
                    "`{key} = \"{g}\"` names no group of the line_pattern (its groups: {})",
                    groups.join(", ")
                ),
            ));
        }
        if is_known_group(g) {
            return Err((
                key,
                format!(
                "`{g}` already is a field the report knows: `{key}` names a group of another name"
            ),
            ));
        }
    }
    if let Some(g) = &roles.memory {
        if memory_unit(g).is_none() {
            let units: Vec<&str> = MEMORY_UNITS.iter().map(|(s, _)| &s[1..]).collect();
            return Err(("memory", format!(
                "the unit of `{g}` is not in its name: name the group `{g}_gb` (or end it in one of {})",
                units.join(", ")
            )));
        }
    }
    if let Some(g) = &roles.step_time {
        if step_unit(g) == StepUnit::InFigure && matches_a_bare_figure(re.as_str(), g) {
            let units: Vec<&str> = TIME_UNITS.iter().map(|(s, _)| &s[1..]).collect();
            return Err(("step_time", format!(
                "the unit of `{g}` is neither in its name nor in what it matches: name the group `{g}_ms` \
                 (or end it in one of {}; a rate, steps per second: `{g}_per_s`), or take the unit into the group, \
                 as in `(?P<{g}>[\\d.]+(?:it/s|s/it))` for a progress bar's `4.98it/s` or `1.23s/it`",
                units.join(", ")
            )));
        }
    }
    Ok(())
}

/// Whether group `name` of `pattern` can match a bare figure (then it says no unit).
fn matches_a_bare_figure(pattern: &str, name: &str) -> bool {
    use regex_syntax::ast::{self, Ast, GroupKind, Span, Visitor};
    struct Find<'a>(&'a str, Option<Span>);
    impl Visitor for Find<'_> {
        type Output = Option<Span>;
        type Err = ();
        fn finish(self) -> Result<Option<Span>, ()> {
            Ok(self.1)
        }
        fn visit_pre(&mut self, a: &Ast) -> Result<(), ()> {
            if let Ast::Group(g) = a {
                if matches!(&g.kind, GroupKind::CaptureName { name, .. } if name.name == self.0) {
                    self.1 = Some(*g.ast.span());
                }
            }
            Ok(())
        }
    }
    let Some(span) = ast::parse::Parser::new()
        .parse(pattern)
        .ok()
        .and_then(|a| ast::visit(&a, Find(name, None)).ok().flatten())
    else {
        return false;
    };
    let inner = &pattern[span.start.offset..span.end.offset];
    regex::Regex::new(&format!("^(?:{inner})$"))
        .is_ok_and(|alone| ["5", "5.33"].iter().any(|f| alone.is_match(f)))
}
